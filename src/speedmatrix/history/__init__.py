"""Runs over time: the results store of every run (``store``: one SQLite file under the results root, a table of
runs, one of cells and one of requests), the regression verdict between two runs (``regress``) and the
reproduction verdict of a run against a published matrix (``reproduce``). Reads finished (or failed) results
folders; measures nothing."""
