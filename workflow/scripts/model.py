"""Rule model: synthesize a tiny dummy-weight model, copy a shipped trained one, or download a Hub model."""

from pathlib import Path

from speedmatrix.core import logs
from speedmatrix.provision import models

with logs.to_file(snakemake.log[0]):
    out_dir = Path(snakemake.output[0]).parent
    spec = snakemake.params.spec
    manifest = models.prepare(snakemake.wildcards.model, spec, out_dir)
    if manifest["source"] == "huggingface":
        print(f"{spec['repo']} at {spec['revision']} -> commit {manifest['revision']} in {manifest['local_dir']} "
              f"({len(manifest['files'])} files)")
    elif manifest["source"] == "trained":
        print(f"trained {spec['trained']} ({manifest['kind']}; its training: training.json) in {out_dir}: "
              f"{sorted(manifest['files'])}")
    else:
        print(f"synthesized {spec['synthesize']} in {out_dir}: {sorted(manifest['files'])}")
