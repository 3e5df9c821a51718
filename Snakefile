# speedmatrix: reproducible LLM-serving benchmark matrices on vLLM.
#
#   pin runtime -> model -> server launch spec -> cells -> loop verdicts
#   -> matrix.parquet / requests.parquet / decisions.parquet -> charts + report
#
# Run it with `make run` (or `snakemake --profile profiles/default`);
# pick an experiment with `--config experiment=<name>`.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/config.yaml"


validate(config, "config/schemas/config.schema.yaml")


include: "rules/common.smk"
include: "rules/pin.smk"
include: "rules/model.smk"
include: "rules/serve.smk"
include: "rules/bench.smk"
include: "rules/loops.smk"
include: "rules/gates.smk"
include: "rules/reference.smk"
include: "rules/aggregate.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        f"{RESULTS}/report.md",
        f"{RESULTS}/report.html",
        f"{RESULTS}/matrix.parquet",
        f"{RESULTS}/requests.parquet",
        f"{RESULTS}/decisions.parquet",
        f"{RESULTS}/models.lock",


onstart:
    preflight()


onsuccess:
    finish_run()


onerror:
    finish_run()
