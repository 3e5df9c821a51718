"""Rule reference: one cell measured by speedmatrix and by `vllm bench serve` on the same server."""

from speedmatrix import logs, reference

with logs.to_file(snakemake.log[0]):
    reference.run_rule(
        experiment_name=snakemake.params.experiment,
        experiments_dir=snakemake.params.experiments_dir,
        server_id=snakemake.wildcards.server_id,
        cell_id=snakemake.wildcards.cell_id,
        launch_path=snakemake.input.launch,
        lock_path=snakemake.input.lock,
        out_json=snakemake.output[0],
        idle_timeout_s=snakemake.params.idle_timeout_s,
    )
