"""Rules prefill, latency, capacity, prefix_cache, decode: measure one cell against its server config's server (started on first use)."""

from speedmatrix import cells, logs

with logs.to_file(snakemake.log[0]):
    cells.run(
        experiment_name=snakemake.params.experiment,
        experiments_dir=snakemake.params.experiments_dir,
        server_id=snakemake.wildcards.server_id,
        cell_id=snakemake.params.cell_id,
        launch_path=snakemake.input.launch,
        lock_path=snakemake.input.lock,
        out_json=snakemake.output.json,
        out_requests=snakemake.output.requests,
        idle_timeout_s=snakemake.params.idle_timeout_s,
    )
