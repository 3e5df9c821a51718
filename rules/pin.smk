rule pin_runtime:
    output:
        str(RUN.runtime_lock),
    log:
        f"{RESULTS}/logs/pin_runtime.log",
    conda:
        "../envs/speedmatrix.yaml"
    params:
        # a changed package set re-pins, and so re-measures: a matrix never
        # mixes runtimes
        packages_sha256=PACKAGES_SHA256,
        # a changed runtime (another image, another venv) re-pins; the same one keeps its lock
        # (delete runtime.lock.json to ask the registry again what a tag names now)
        runtime=EXP.runtime,
        experiment=config["experiment"],
        experiments_dir=config["experiments_dir"],
    script:
        "../workflow/scripts/pin_runtime.py"
