rule pin_runtime:
    output:
        f"{RESULTS}/runtime.lock.json",
    log:
        f"{RESULTS}/logs/pin_runtime.log",
    conda:
        "../envs/speedmatrix.yaml"
    params:
        experiment=config["experiment"],
        experiments_dir=config["experiments_dir"],
    script:
        "../workflow/scripts/pin_runtime.py"
