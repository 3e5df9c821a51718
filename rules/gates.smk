# Quality gates (seed 003): smoke, structured JSON, N tool calls against each
# server config's server. A failed gate is a verdict in its JSON and in the
# report, not a failed job.
rule gate:
    input:
        **server_job_input(),
    output:
        f"{RESULTS}/gates/{{server_id}}/{{gate}}.json",
    log:
        f"{RESULTS}/logs/gates/{{server_id}}/{{gate}}.log",
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
        **server_job_resources("gate"),
    params:
        **server_job_params("gate"),
        gate=gate_settings,
    script:
        "../workflow/scripts/gate.py"
