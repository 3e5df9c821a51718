"""The cell rules (one per workload kind, made from the registry in rules/cells.smk): measure one cell against its
server config's server (started on first use)."""

from speedmatrix.core import logs
from speedmatrix.jobs import cells
from speedmatrix.jobs.job import JobContext

with logs.to_file(snakemake.log[0]):
    p = snakemake.params
    cells.run(JobContext.from_snakemake(snakemake), p.cell, p.measured_with, p.loops, snakemake.output.json,
              snakemake.output.requests)
