# The report: report.md, a self-contained report.html (interactive charts, the
# Vega code inlined: it opens offline) and the PNG of every chart the
# experiment can have data for (speedmatrix.report.charts.applicable); a chart that
# finds no rows is a placeholder PNG, left out of both reports. Each chart's
# caption (report.html and `snakemake --report`) is docs/captions/<name>.rst.
rule report:
    input:
        matrix=rules.aggregate.output.matrix,
        decisions=rules.aggregate.output.decisions,
        requests=rules.aggregate.output.requests,
        lock=rules.pin_runtime.output[0],
        launches=startup_files(),
        gates=gate_files(),
        lossless=lossless_files(),
        references=reference_files(),
        models_lock=rules.models_lock.output[0],
        published=published_files(),
    output:
        **chart_outputs(),
        md=str(RUN.report_md),
        html=report(
            str(RUN.report_html),
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
        # the charts' captions (the same text as snakemake --report's)
        captions="docs/captions",
        # the results store: the section on this run's cells in earlier runs
        history=str(sm_store.path_for(config["results_dir"])),
        # config `against`: a run this one is judged against in its report
        against=config.get("against", ""),
    script:
        "../workflow/scripts/report.py"
