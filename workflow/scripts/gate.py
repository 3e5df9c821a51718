"""Rule gate: one quality gate (smoke, structured_json, tool_calls) against a server config's server."""

from speedmatrix.core import logs
from speedmatrix.jobs import gates
from speedmatrix.jobs.job import JobContext

with logs.to_file(snakemake.log[0]):
    gates.run_rule(JobContext.from_snakemake(snakemake), snakemake.wildcards.gate, snakemake.output[0])
