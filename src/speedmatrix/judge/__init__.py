"""Judging measured cells: a cell's loop verdict under a policy (``loopcheck``) and the decisions drawn from
the matrix (``decide``: the Pareto frontier, the best config per latency target, the best sweep point). It
asks the kinds (``workloads``) which figure or which cells each verdict reads."""
