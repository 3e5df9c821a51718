"""What one rule of the workflow does, given its context (``job.JobContext``): a cell (``cells``), the quality
gates (``gates``), the independent clients beside speedmatrix (``reference``), the matrix and decisions
tables (``aggregate``), what a run needs from the machine, checked before any job (``preflight``), and the
run summary from Snakemake's record (``summary``)."""
