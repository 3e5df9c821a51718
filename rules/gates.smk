# Quality gates (seed 003): smoke, structured JSON, N tool calls against each
# server config's server. A failed gate is a verdict in its JSON and in the
# report, not a failed job.
rule gate:
    input:
        launch=f"{RESULTS}/servers/{{server_id}}/launch.json",
        lock=f"{RESULTS}/runtime.lock.json",
    output:
        f"{RESULTS}/gates/{{server_id}}/{{gate}}.json",
    log:
        f"{RESULTS}/logs/gates/{{server_id}}/{{gate}}.log",
    priority: cell_priority
    conda:
        "../envs/speedmatrix.yaml"
    threads: 1024
    resources:
        device=1,
        gpu=server_gpus,
    params:
        experiment=config["experiment"],
        experiments_dir=config["experiments_dir"],
        idle_timeout_s=IDLE_TIMEOUT_S,
    script:
        "../workflow/scripts/gate.py"
