"""Rule server_launch: the exact launch spec of one server config."""

from speedmatrix.core import atomic, logs
from speedmatrix.plan import experiment
from speedmatrix.serve import runtimes

with logs.to_file(snakemake.log[0]):
    exp = experiment.load(snakemake.params.experiment, snakemake.params.experiments_dir)
    lock = atomic.read_json(snakemake.input.lock)
    spec = runtimes.launch_spec(exp, snakemake.wildcards.server_id, snakemake.params.models_dir, lock)
    atomic.write_json(snakemake.output[0], spec)
    print("launch argv ({port}: the host port, chosen at start):", spec["argv_redacted"])
