# One rule per workload kind, from the registry (speedmatrix.workloads):
# `snakemake --list-rules` and the job counts show each kind, and a cluster
# profile can give a kind its own limits (--set-resources decode:...). All of
# them run the same code path, speedmatrix.jobs.cells.run, as `speedmatrix measure`
# does by hand. The params hand the job everything it needs (the cell, the settings
# its measurement depends on): the job expands nothing.
for kind in WORKLOADS:

    rule:
        name:
            kind
        input:
            **server_job_input(),
            dataset=dataset_file_of(kind),
        output:
            json=f"{RESULTS}/cells/{{server_id}}/{kind}-{{cell_key}}.json",
            requests=f"{RESULTS}/cells/{{server_id}}/{kind}-{{cell_key}}{sm_runfolder.CELL_REQUESTS_SUFFIX}",
        log:
            f"{RESULTS}/logs/cells/{{server_id}}/{kind}-{{cell_key}}.log",
        priority: cell_priority
        # on a cluster, every job of one server config runs in one allocation
        group:
            "server-{server_id}"
        conda:
            "../envs/speedmatrix.yaml"
        # the whole machine locally: nothing else of the workflow runs while a
        # cell measures (a loop job on a shared core skews a CPU server's
        # timings); on a cluster, the CPUs of the allocation (config.yaml: cluster)
        threads: job_threads
        resources:
            **server_job_resources(kind),
        params:
            **server_job_params(kind),
            cell_id=cell_id_of(kind),
            cell=cell_spec_of(kind),
            measured_with=EXP.measured_with,
            # the loop thresholds the online watch uses (they are part of measured_with only where they end
            # requests: client.stop_looping)
            loops=EXP.loops,
        script:
            "../workflow/scripts/cell.py"
