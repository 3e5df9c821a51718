# The launch spec of a server config: the exact argv, environment and model
# hashes. The server itself is brought up by the first cell that needs it
# and writes servers/<id>/startup.json (docs/decisions/0001).
rule server_launch:
    input:
        lock=f"{RESULTS}/runtime.lock.json",
        models=server_models,
    output:
        f"{RESULTS}/servers/{{server_id}}/launch.json",
    log:
        f"{RESULTS}/logs/servers/{{server_id}}.launch.log",
    conda:
        "../envs/speedmatrix.yaml"
    params:
        experiment=config["experiment"],
        experiments_dir=config["experiments_dir"],
        models_dir=MODELS,
        server=server_spec,
    script:
        "../workflow/scripts/server_launch.py"
