# A model: synthesized locally (random weights) or downloaded from the Hub at
# its revision into the Hugging Face cache; its manifest records the commit
# and every file's hash. models.lock gathers them for the run.
rule model:
    output:
        f"{MODELS}/{{model}}/speedmatrix-model.json",
    log:
        f"{RESULTS}/logs/models/{{model}}.log",
    conda:
        "../envs/speedmatrix.yaml"
    params:
        spec=model_spec,
    script:
        "../workflow/scripts/model.py"


rule models_lock:
    input:
        [model_manifest(name) for name in EXP.models],
    output:
        str(RUN.models_lock),
    log:
        f"{RESULTS}/logs/models_lock.log",
    conda:
        "../envs/speedmatrix.yaml"
    params:
        names=list(EXP.models),
    script:
        "../workflow/scripts/models_lock.py"
