"""Presenting runs: the report of a run built once as blocks and written as markdown and HTML (``document``,
``sections``, each kind's own table from ``workloads``), its charts (``charts``), the comparison of runs
(``compare``), the regression verdict and a cell across runs (``regression``), a run's loops, matrix and report
again from its cell files (``rederive``), where a finished run's wall time went (``walltime``) and what measuring
side by side changed (``interference``)."""
