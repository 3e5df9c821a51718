# One rule per cell kind (prefill, latency, capacity, prefix_cache, decode):
# `snakemake --list-rules` and the job counts show each kind, and a cluster
# profile can give each kind its own limits. All of them run the same code
# path, speedmatrix.cells.run, as `speedmatrix bench` does by hand.
for kind in WORKLOADS:

    rule:
        name:
            kind
        input:
            launch=f"{RESULTS}/servers/{{server_id}}/launch.json",
            lock=f"{RESULTS}/runtime.lock.json",
        output:
            json=f"{RESULTS}/cells/{{server_id}}/{kind}-{{cell_key}}.json",
            requests=f"{RESULTS}/cells/{{server_id}}/{kind}-{{cell_key}}.requests.parquet",
        log:
            f"{RESULTS}/logs/cells/{{server_id}}/{kind}-{{cell_key}}.log",
        priority: cell_priority
        conda:
            "../envs/speedmatrix.yaml"
        # the whole machine: nothing else of the workflow runs while a cell
        # measures (a loop job on a shared core skews a CPU server's timings).
        # Snakemake scales this down to --cores locally; profiles/slurm sets
        # the CPUs of a cluster allocation (set-threads).
        threads: 1024
        resources:
            device=1,
            # GPUs of the server config (tensor x pipeline parallel; 0 on a CPU runtime)
            gpu=server_gpus,
        params:
            cell_id=cell_id_of(kind),
            cell=cell_spec_of(kind),
            experiment=config["experiment"],
            experiments_dir=config["experiments_dir"],
            idle_timeout_s=IDLE_TIMEOUT_S,
            measured_with=MEASURED_WITH,
        script:
            "../workflow/scripts/cell.py"
