"""Rule gate: one quality gate (smoke, structured_json, tool_calls) against a server config's server."""

from speedmatrix import gates, logs

with logs.to_file(snakemake.log[0]):
    gates.run_rule(
        experiment_name=snakemake.params.experiment,
        experiments_dir=snakemake.params.experiments_dir,
        server_id=snakemake.wildcards.server_id,
        gate=snakemake.wildcards.gate,
        launch_path=snakemake.input.launch,
        lock_path=snakemake.input.lock,
        out_json=snakemake.output[0],
        idle_timeout_s=snakemake.params.idle_timeout_s,
    )
