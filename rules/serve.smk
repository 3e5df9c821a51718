# Tensor parallelism above 1: CUDA peer access and NCCL's P2P use are checked
# before the server config's launch (speedmatrix.serve.p2p); a config on one GPU or
# the CPU has no such job (rules/common.smk, P2P_SERVER_IDS).
# The launch spec of a server config: the exact argv, environment and model
# hashes. The server itself is brought up by the first cell that needs it
# and writes servers/<id>/startup.json (docs/decisions/0001).
rule p2p_check:
    input:
        lock=rules.pin_runtime.output[0],
    output:
        f"{RESULTS}/servers/{{server_id}}/p2p.json",
    log:
        f"{RESULTS}/logs/servers/{{server_id}}.p2p.log",
    conda:
        "../envs/speedmatrix.yaml"
    # the whole device: no cell measures while the GPUs are tested
    resources:
        device=DEVICE_UNITS,
        gpu=server_gpus,
        gpu_model=server_gpu_model,
    params:
        gpus=server_gpus_needed,
        device=EXP.runtime["device"],
    script:
        "../workflow/scripts/p2p_check.py"


rule server_launch:
    input:
        lock=rules.pin_runtime.output[0],
        models=server_models,
        p2p=p2p_of,
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
