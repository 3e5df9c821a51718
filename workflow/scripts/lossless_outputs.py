"""Rule lossless_outputs: a speculative config's outputs for the losslessness check, on its server."""

from speedmatrix.core import logs
from speedmatrix.jobs import lossless
from speedmatrix.jobs.job import JobContext

with logs.to_file(snakemake.log[0]):
    lossless.outputs_rule(JobContext.from_snakemake(snakemake), snakemake.params.settings, snakemake.params.check,
                          snakemake.output[0])
