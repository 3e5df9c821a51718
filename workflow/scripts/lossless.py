"""Rule lossless: on the twin's server, its outputs, the scores of both and the verdict per sampling setting."""

from speedmatrix.core import logs
from speedmatrix.jobs import lossless
from speedmatrix.jobs.job import JobContext

with logs.to_file(snakemake.log[0]):
    lossless.verdict_rule(JobContext.from_snakemake(snakemake), snakemake.input.outputs, snakemake.params.check,
                          snakemake.output[0])
