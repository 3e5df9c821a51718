"""Rule pin_runtime: record exactly which runtime the servers run."""

from speedmatrix.core import atomic, logs
from speedmatrix.plan import experiment
from speedmatrix.serve import runtimes

with logs.to_file(snakemake.log[0]):
    exp = experiment.load(snakemake.params.experiment, snakemake.params.experiments_dir)
    lock = runtimes.pin(exp)
    atomic.write_json(snakemake.output[0], lock)
    packages = f" (packages sha256 {lock['packages_sha256'][:16]})" if lock.get("packages_sha256") else ""
    print(f"pinned {lock['runtime_ref']}{packages}")
