rule cell:
    input:
        launch=f"{RESULTS}/servers/{{server_id}}/launch.json",
        lock=f"{RESULTS}/runtime.lock.json",
    output:
        json=f"{RESULTS}/cells/{{server_id}}/{{cell_id}}.json",
        requests=f"{RESULTS}/cells/{{server_id}}/{{cell_id}}.requests.parquet",
    log:
        f"{RESULTS}/logs/cells/{{server_id}}/{{cell_id}}.log",
    priority: cell_priority
    conda:
        "../envs/speedmatrix.yaml"
    # the whole machine: nothing else of the workflow runs while a cell
    # measures (a loop job on a shared core skews a CPU server's timings).
    # Snakemake scales this down to --cores locally; profiles/slurm sets the
    # CPUs of a cluster allocation (set-threads).
    threads: 1024
    resources:
        device=1,
        # GPUs of the server config (tensor x pipeline parallel; 0 on a CPU runtime)
        gpu=server_gpus,
    params:
        experiment=config["experiment"],
        experiments_dir=config["experiments_dir"],
        idle_timeout_s=IDLE_TIMEOUT_S,
    script:
        "../workflow/scripts/cell.py"
