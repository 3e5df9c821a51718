"""Rule synthesize_model: write a tiny dummy-weight model directory."""

from pathlib import Path

from speedmatrix import logs, models

with logs.to_file(snakemake.log[0]):
    out_dir = Path(snakemake.output[0]).parent
    manifest = models.synthesize(snakemake.params.preset, out_dir)
    print(f"synthesized {snakemake.params.preset} in {out_dir}: {sorted(manifest['files'])}")
