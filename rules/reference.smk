# Agreement with vLLM's own client (`vllm bench serve`): the cells named under
# `reference:` are measured again on the same server by both clients, in
# alternation (speedmatrix.jobs.reference).
rule reference:
    input:
        **server_job_input(),
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
        **server_job_resources("reference"),
    params:
        **server_job_params("reference"),
    script:
        "../workflow/scripts/reference.py"
