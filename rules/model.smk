rule synthesize_model:
    output:
        f"{MODELS}/{{model}}/speedmatrix-model.json",
    log:
        f"{RESULTS}/logs/models/{{model}}.log",
    conda:
        "../envs/speedmatrix.yaml"
    params:
        preset=model_preset,
    script:
        "../workflow/scripts/synthesize_model.py"
