# Agreement with vLLM's own client (`vllm bench serve`): the cells named under
# `reference:` are measured again on the same server by both clients, in
# alternation (speedmatrix.jobs.reference).
rule reference:
    input:
        launch=f"{RESULTS}/servers/{{server_id}}/launch.json",
        lock=f"{RESULTS}/runtime.lock.json",
    output:
        f"{RESULTS}/reference/{{server_id}}/{{cell_id}}.json",
    log:
        f"{RESULTS}/logs/reference/{{server_id}}/{{cell_id}}.log",
    priority: cell_priority
    # on a cluster, every job of one server config runs in one allocation
    group:
        "server-{server_id}"
    conda:
        "../envs/speedmatrix.yaml"
    # the whole machine locally: nothing else of the workflow runs while it measures (a loop
    # job on a shared core skews a CPU server's timings); on a cluster, the allocation's CPUs
    threads: job_threads
    resources:
        **SERVER_LANES,
        device=device_of("reference"),
        gpu=server_gpus,
        mem_mb=config["cluster"]["job_mem_mb"],
        runtime=config["cluster"]["job_runtime_min"],
    params:
        experiment=config["experiment"],
        experiments_dir=config["experiments_dir"],
        results_root=results_root,
        idle_timeout_s=IDLE_TIMEOUT_S,
        placement=placement_of("reference"),
    script:
        "../workflow/scripts/reference.py"
