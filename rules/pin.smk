rule pin_runtime:
    output:
        f"{RESULTS}/runtime.lock.json",
    log:
        f"{RESULTS}/logs/pin_runtime.log",
    conda:
        "../envs/speedmatrix.yaml"
    params:
        # a changed package set re-pins, and so re-measures: a matrix never
        # mixes runtimes
        packages_sha256=PACKAGES_SHA256,
        experiment=config["experiment"],
        experiments_dir=config["experiments_dir"],
    script:
        "../workflow/scripts/pin_runtime.py"
