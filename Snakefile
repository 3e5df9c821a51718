# speedmatrix: reproducible LLM-serving benchmark matrices on vLLM.
#
#   pin runtime -> model -> server launch spec -> cells -> loop verdicts
#   -> matrix.parquet / requests.parquet / decisions.parquet -> charts + report
#
# Run it with `make run` (or `snakemake --profile profiles/default`);
# pick an experiment with `--config experiment=<name>`.
from snakemake.utils import min_version, validate

from speedmatrix.core import settings as sm_settings

min_version("9.0")


configfile: "config/config.yaml"


# --config cluster={job_runtime_min: 5} gives nested values as strings: typed as the schema says
sm_settings.typed(config, sm_settings.schema("config"))


validate(config, "config/schemas/config.schema.yaml")


include: "rules/common.smk"
include: "rules/pin.smk"
include: "rules/model.smk"
include: "rules/datasets.smk"
include: "rules/serve.smk"
include: "rules/cells.smk"
include: "rules/loops.smk"
include: "rules/gates.smk"
include: "rules/lossless.smk"
include: "rules/reference.smk"
include: "rules/aggregate.smk"
include: "rules/report.smk"


# On a cluster, the light jobs run where Snakemake runs (the login node): pinning, model
# downloads and manifests (compute nodes often have no internet), launch specs, loop verdicts,
# aggregation and the report take seconds, and as cluster jobs each cost a submission, a
# Snakemake start on the node and a status poll. What measures or needs the node's GPUs (cells,
# gates, reference clients, the P2P check) is submitted. Locally this changes nothing.
localrules:
    pin_runtime,
    model,
    models_lock,
    datasets_lock,
    server_launch,
    loops,
    aggregate,
    report,
    all,


rule all:
    default_target: True
    input:
        rules.report.output.md,
        rules.report.output.html,
        rules.aggregate.output,
        rules.models_lock.output,
        datasets_lock_file(),


onstart:
    preflight()


onsuccess:
    finish_run(True)


onerror:
    finish_run(False)
