"""Rule aggregate: matrix.parquet (one row per cell) and requests.parquet (one row per request)."""

from speedmatrix import aggregate, logs

with logs.to_file(snakemake.log[0]):
    m = aggregate.build(
        snakemake.input.cells,
        snakemake.input.loops,
        snakemake.input.requests,
        snakemake.output.matrix,
        snakemake.output.requests,
    )
    print(f"{len(m)} cells: {m['status'].value_counts().to_dict()}")
