"""Rule aggregate: matrix.parquet (one row per cell), requests.parquet (one row per request) and
decisions.parquet (one row per cell and latency target)."""

from speedmatrix.core import logs
from speedmatrix.jobs import aggregate
from speedmatrix.plan import experiment

with logs.to_file(snakemake.log[0]):
    exp = experiment.load(snakemake.params.experiment, snakemake.params.experiments_dir)
    m = aggregate.build(
        snakemake.input.cells,
        snakemake.input.loops,
        snakemake.input.requests,
        snakemake.output.matrix,
        snakemake.output.requests,
        snakemake.output.decisions,
        targets=exp.targets,
        gpus={s.id: s.gpus for s in exp.servers},
    )
    print(f"{len(m)} cells: {m['status'].value_counts().to_dict()}")
    for t in exp.targets:
        print(f"target {t.name}: {t.describe()}")
