# The report: report.md / report.html and every chart of speedmatrix.charts.CHARTS
# (HTML + PNG; a chart without data is a placeholder and is left out of the
# report). Each chart's caption for `snakemake --report` is docs/captions/<name>.rst.
rule report:
    input:
        matrix=f"{RESULTS}/matrix.parquet",
        decisions=f"{RESULTS}/decisions.parquet",
        lock=f"{RESULTS}/runtime.lock.json",
        launches=startup_files(),
        gates=gate_files(),
        references=reference_files(),
        models_lock=f"{RESULTS}/models.lock",
    output:
        **chart_outputs(),
        md=f"{RESULTS}/report.md",
        html=report(
            f"{RESULTS}/report.html",
            caption="../docs/captions/report.rst",
            category="Tables",
        ),
    log:
        f"{RESULTS}/logs/report.log",
    conda:
        "../envs/speedmatrix.yaml"
    params:
        experiment=config["experiment"],
        experiments_dir=config["experiments_dir"],
    script:
        "../workflow/scripts/report.py"
