rule aggregate:
    input:
        cells=cell_files(".json"),
        requests=cell_files(".requests.parquet"),
        loops=loop_files(),
    output:
        matrix=f"{RESULTS}/matrix.parquet",
        requests=f"{RESULTS}/requests.parquet",
        decisions=f"{RESULTS}/decisions.parquet",
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
