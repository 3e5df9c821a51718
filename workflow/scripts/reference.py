"""Rule reference: one cell measured by speedmatrix and by `vllm bench serve` on the same server."""

from speedmatrix.core import logs
from speedmatrix.jobs import reference
from speedmatrix.jobs.job import JobContext

with logs.to_file(snakemake.log[0]):
    reference.run_rule(JobContext.from_snakemake(snakemake), snakemake.wildcards.cell_id, snakemake.output[0])
