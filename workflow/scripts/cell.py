"""Rules prefill, latency, capacity, prefix_cache, decode (one per workload kind): measure one cell against its
server config's server (started on first use)."""

from speedmatrix import cells, logs
from speedmatrix.job import JobContext

with logs.to_file(snakemake.log[0]):
    cells.run(JobContext.from_snakemake(snakemake), snakemake.params.cell_id, snakemake.output.json,
              snakemake.output.requests)
