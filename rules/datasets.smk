# The experiment's datasets (speedmatrix.measure.datasets), each loaded once and pinned: source,
# revision, record count and the SHA-256 of its file or rows. Every cell that uses one
# records the same entry in its provenance.
rule datasets_lock:
    input:
        dataset_files(),
    output:
        str(RUN.datasets_lock),
    log:
        f"{RESULTS}/logs/datasets_lock.log",
    conda:
        "../envs/speedmatrix.yaml"
    params:
        datasets=EXP.raw.get("datasets") or {},
    script:
        "../workflow/scripts/datasets_lock.py"
