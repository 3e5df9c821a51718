rule aggregate:
    input:
        cells=cell_files(".json"),
        requests=cell_files(sm_runfolder.CELL_REQUESTS_SUFFIX),
        loops=loop_files(),
    output:
        matrix=str(RUN.matrix),
        requests=str(RUN.requests),
        decisions=str(RUN.decisions),
    log:
        f"{RESULTS}/logs/aggregate.log",
    conda:
        "../envs/speedmatrix.yaml"
    params:
        experiment=config["experiment"],
        experiments_dir=config["experiments_dir"],
        # a new or changed latency target re-derives the decisions, never a measurement
        slos=EXP.raw.get("slos", {}),
    script:
        "../workflow/scripts/aggregate.py"
