"""Rule report: charts (HTML + PNG) and report.md / report.html."""

from speedmatrix.core import logs
from speedmatrix.report import document

with logs.to_file(snakemake.log[0]):
    document.build(
        experiment_name=snakemake.params.experiment,
        experiments_dir=snakemake.params.experiments_dir,
        matrix_path=snakemake.input.matrix,
        lock_path=snakemake.input.lock,
        launch_paths=snakemake.input.launches,
        out=dict(snakemake.output.items()),
        gate_paths=snakemake.input.gates,
        models_lock_path=snakemake.input.models_lock,
        reference_paths=snakemake.input.references,
        decisions_path=snakemake.input.decisions,
        requests_path=snakemake.input.requests,
        captions_dir=snakemake.params.captions,
        lossless_paths=snakemake.input.lossless,
        published_path=(snakemake.input.published or [None])[0],
        history_path=snakemake.params.history,
        against=snakemake.params.against or None,
    )
