# Agreement with vLLM's own client (`vllm bench serve`): the cells named under
# `reference:` are measured again on the same server by both clients, in
# alternation (speedmatrix.reference).
rule reference:
    input:
        launch=f"{RESULTS}/servers/{{server_id}}/launch.json",
        lock=f"{RESULTS}/runtime.lock.json",
    output:
        f"{RESULTS}/reference/{{server_id}}/{{cell_id}}.json",
    log:
        f"{RESULTS}/logs/reference/{{server_id}}/{{cell_id}}.log",
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
        "../workflow/scripts/reference.py"
