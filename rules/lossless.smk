# The losslessness check of every speculative server config with a twin (the config with the same model and
# arguments and no speculation; speedmatrix.jobs.lossless): the config's outputs on its server, then on the
# twin's server the twin's own outputs, every token of both scored by the target, and the verdict per sampling
# setting. A Lossy verdict is a result (its cells' status), never a failed job.
rule lossless_outputs:
    input:
        **server_job_input(),
    output:
        f"{RESULTS}/lossless/{{server_id}}/outputs.json",
    log:
        f"{RESULTS}/logs/lossless/{{server_id}}/outputs.log",
    priority: cell_priority
    group:
        "server-{server_id}"
    conda:
        "../envs/speedmatrix.yaml"
    threads: job_threads
    resources:
        **server_job_resources("lossless"),
    params:
        **server_job_params("lossless"),
        settings=lossless_settings_of,
        check=EXP.lossless,
    script:
        "../workflow/scripts/lossless_outputs.py"


rule lossless:
    input:
        **server_job_input(),
        outputs=f"{RESULTS}/lossless/{{spec_id}}/outputs.json",
    output:
        f"{RESULTS}/lossless/{{server_id}}/verdict-{{spec_id}}.json",
    log:
        f"{RESULTS}/logs/lossless/{{server_id}}/verdict-{{spec_id}}.log",
    priority: cell_priority
    group:
        "server-{server_id}"
    conda:
        "../envs/speedmatrix.yaml"
    threads: job_threads
    resources:
        **server_job_resources("lossless"),
    params:
        **server_job_params("lossless"),
        check=EXP.lossless,
    script:
        "../workflow/scripts/lossless.py"
