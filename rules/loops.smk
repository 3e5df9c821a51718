# Loop verdicts over the texts a cell saved, and the cell's status (lossy,
# looped, unstable): a threshold change reruns this and the aggregation, never
# the measurement.
rule loops:
    input:
        cell=f"{RESULTS}/cells/{{server_id}}/{{cell_id}}.json",
        requests=f"{RESULTS}/cells/{{server_id}}/{{cell_id}}{sm_runfolder.CELL_REQUESTS_SUFFIX}",
        # a speculative config's losslessness verdict (its cells' status: lossy)
        lossless=lossless_of_cell,
    output:
        f"{RESULTS}/loops/{{server_id}}/{{cell_id}}.json",
    log:
        f"{RESULTS}/logs/loops/{{server_id}}/{{cell_id}}.log",
    conda:
        "../envs/speedmatrix.yaml"
    params:
        settings=EXP.loops,
        stability=EXP.stability,
    script:
        "../workflow/scripts/loops.py"
