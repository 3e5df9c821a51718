"""Rule models_lock: every model of the experiment with its commit (or recipe) and file hashes."""

from speedmatrix.core import atomic, logs
from speedmatrix.provision import models

with logs.to_file(snakemake.log[0]):
    manifests = {name: atomic.read_json(path) for name, path in zip(snakemake.params.names, snakemake.input)}
    atomic.write_json(snakemake.output[0], models.lock(manifests))
    for name, m in manifests.items():
        print(f"{name}: {m.get('repo') or m.get('preset')} @ {m.get('revision') or 'synthesized'}")
