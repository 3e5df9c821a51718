rule aggregate:
    input:
        cells=cell_files(".json"),
        requests=cell_files(".requests.parquet"),
        loops=loop_files(),
    output:
        matrix=f"{RESULTS}/matrix.parquet",
        requests=f"{RESULTS}/requests.parquet",
    log:
        f"{RESULTS}/logs/aggregate.log",
    conda:
        "../envs/speedmatrix.yaml"
    script:
        "../workflow/scripts/aggregate.py"
