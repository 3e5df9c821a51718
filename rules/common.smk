# Shared helpers: the experiment, its cells, and named input functions.
import atexit
import os
from pathlib import Path

from snakemake_interface_executor_plugins.settings import ExecMode
from snakemake.settings.enums import Quietness

from speedmatrix.jobs import allocations as sm_allocations
from speedmatrix.jobs import enginecheck as sm_enginecheck
from speedmatrix.serve import broker as sm_broker
from speedmatrix.report import charts as sm_charts
from speedmatrix.plan import experiment as sm_experiment
from speedmatrix.serve import pool as sm_pool
from speedmatrix.jobs import gates as sm_gates
from speedmatrix.jobs import preflight as sm_preflight
from speedmatrix.serve import procs as sm_procs
from speedmatrix.serve import runtimes as sm_runtimes
from speedmatrix.jobs import summary as sm_summary
from speedmatrix.history import store as sm_store
from speedmatrix.core import runfolder as sm_runfolder
from speedmatrix import workloads as sm_workloads

try:
    EXP = sm_experiment.load(config["experiment"], config["experiments_dir"])
except sm_experiment.ConfigError as err:
    raise WorkflowError(f"speedmatrix: {err}") from None

RESULTS = f"{config['results_dir']}/{EXP.name}"
# every file name of the run's folder (speedmatrix.core.runfolder)
RUN = sm_runfolder.RunFolder(RESULTS)
MODELS = config["models_dir"]
SERVER_IDS = [s.id for s in EXP.servers]
# the workload kinds, one rule each (rules/cells.smk), from the registry
WORKLOADS = sm_workloads.names()
GATES = list(EXP.raw.get("gates", {}))
CELLS = EXP.cells()
PACKAGES_SHA256 = sm_runtimes.packages_digest()
IDLE_TIMEOUT_S = float(config["server_idle_timeout_s"])
# The node's GPU pool (config `gpus`, else NVML's count on a GPU runtime; none on the
# CPU): configs on disjoint GPUs measure side by side (speedmatrix.serve.pool, docs/gpu.md).
# Snakemake's `device` resource has one unit per GPU of the pool (1 without a pool)
# unless the profile or --resources set it; one mutex per config keeps a config's
# jobs one at a time.
try:
    # every GPU this node gives the run (also what the check before any job holds tensor x pipeline parallel to)
    GPU_NODE = sm_pool.node_gpus(config.get("gpus"), EXP)
except sm_experiment.ConfigError as err:
    raise WorkflowError(f"speedmatrix: {err}") from None
# a pool is one node's: on a cluster each server config has its own allocation
GPU_POOL = GPU_NODE if workflow.local_exec and len(GPU_NODE) > 1 else ()
DEVICE_UNITS = sm_pool.device_units(GPU_POOL)
if "device" in workflow.global_resources:
    # the profile or --resources fixed it (profiles/slurm: one allocation, one device set);
    # device=1 is one at a time: no pool
    DEVICE_UNITS = int(getattr(workflow.global_resources["device"], "value", 1) or 1)
    GPU_POOL = GPU_POOL if DEVICE_UNITS > 1 else ()
else:
    workflow.register_resource("device", DEVICE_UNITS)
# one mutex per server config when configs run side by side: never two jobs of one
# config at once (they share its server and would measure each other)
SERVER_LANES = (
    {}
    if DEVICE_UNITS == 1
    else {
        f"server_lane_{k}": (
            lambda wildcards, k=k: int(SERVER_IDS.index(wildcards.server_id) == k)
        )
        for k in range(len(SERVER_IDS))
    }
)
for _lane in SERVER_LANES:
    workflow.register_resource(_lane, 1)

# The servers this workflow starts are owned by its main process (on a
# cluster: by the Snakemake process that runs a group job in its allocation):
# when it ends, however it ends, their brokers stop them (docs/decisions/0001).
if workflow.is_main_process or workflow.exec_mode == ExecMode.REMOTE:
    sm_procs.claim_ownership(workflow.is_main_process)


wildcard_constraints:
    server_id="[A-Za-z0-9][A-Za-z0-9_.-]*",
    cell_id=sm_workloads.cell_id_pattern(),
    # a cell id without its kind (each kind has its rule, rules/cells.smk)
    cell_key=sm_workloads.cell_key_pattern(),
    model="[A-Za-z0-9][A-Za-z0-9_.-]*",
    spec_id="[A-Za-z0-9][A-Za-z0-9_.-]*",
    gate="|".join(sm_gates.GATES),


# A dry run for a cluster (`make plan PROFILE=slurm`) ends by printing the allocations it would submit, from
# Snakemake's own group jobs (speedmatrix.jobs.allocations): the DAG exists only once the run is planned, and
# whether this is a dry run of a cluster profile only once Snakemake has read its settings.
def for_cluster():
    # the jobs go to a cluster: a remote executor, or a dry run of a profile that makes allocations of groups
    # (profiles/slurm: group-components; a dry run's executor is a local one)
    return not workflow.local_exec or (
        workflow.dryrun and bool(workflow.group_settings.group_components)
    )


def print_allocations():
    if not workflow.dryrun:
        return
    try:
        if Quietness.PROGRESS in (workflow.output_settings.quiet or ()):
            # `make plan`: Snakemake's own table would come twice (`--quiet rules`) or not at all
            print(sm_allocations.job_counts(workflow.dag))
        if for_cluster():
            print(sm_allocations.text(sm_allocations.of_dag(workflow.dag)))
    except (
        Exception
    ) as err:  # Snakemake could not merge a group's resources: its own words
        print(f"speedmatrix: the allocations could not be listed: {err}")


if workflow.is_main_process:
    atexit.register(print_allocations)


def results_root(wildcards):
    # the results root (config results_dir): the device lock and the registry of
    # running servers live there (speedmatrix.jobs.job.JobContext)
    return config["results_dir"]


def stop_servers():
    stopped = sm_broker.stop_all(config["results_dir"])
    if stopped:
        print(f"speedmatrix: stopped {stopped} server(s)")


def preflight():
    # before any job: what the run needs from this machine, one message per cause
    problems = sm_preflight.problems(EXP, cluster=for_cluster())
    # every server config against the vLLM that will serve it (speedmatrix validate's check; cached)
    found = sm_enginecheck.check(
        EXP,
        MODELS,
        gpus_here=None if for_cluster() else len(GPU_NODE) or None,
    )
    for line in found.lines():
        if not line.startswith("error: "):
            print(f"speedmatrix: {line}")
    problems += found.errors
    if problems:
        raise WorkflowError("speedmatrix: before any job:\n  " + "\n  ".join(problems))
    moved = sm_preflight.moved_tag(EXP, str(RUN.runtime_lock))
    if moved:
        print(f"speedmatrix: {moved}")
    recorded = sm_preflight.recorded_run(EXP)
    if recorded:
        print(
            f"speedmatrix: {recorded}; each job's progress is in its log, results/<experiment>/logs/"
        )
    for name in sm_preflight.api_keys(EXP):
        print(
            f"speedmatrix: {name} is not set: the servers of this run take a key generated for the run "
            "(kept in this process's environment, never written)"
        )


def finish_run(succeeded):
    # the end of every run: servers stopped, then what ran and why anything failed, and where the report is
    stop_servers()
    if workflow.is_main_process:
        # Snakemake's own record of the run: every job of its DAG, and those its scheduler saw fail
        jobs = sm_summary.jobs_of(workflow.dag, workflow.scheduler.failed)
        summary = sm_summary.write(Path(RESULTS), jobs, succeeded)
        print(sm_summary.text(summary))
        # every run, finished or not, into the results store (speedmatrix history)
        history = sm_store.path_for(config["results_dir"])
        try:
            run_id, new = sm_store.add(RESULTS, history)
            print(
                f"speedmatrix: run {run_id} {'added to' if new else 'already in'} the results store {history} "
                "(speedmatrix history; speedmatrix regress BASE NEW)"
            )
        # a store problem is said in one line; the run's end is not a traceback
        except Exception as err:
            print(
                f"speedmatrix: the run was not added to the results store {history}: "
                f"{type(err).__name__}: {err}"
            )
        page = RUN.report_html
        if succeeded and page.exists():
            print(
                f"speedmatrix: the report is {page} (one page, works offline: open it in a browser, "
                f"e.g. xdg-open {page}); as text: {page.with_suffix('.md')}"
            )


def published_files():
    # the published matrix the experiment reproduces (its `published:` key), for the report
    name = EXP.raw.get("published")
    return (
        [str(sm_experiment.published_path(name, config["experiments_dir"]))]
        if name
        else []
    )


def cell_files(suffix):
    return [f"{RESULTS}/cells/{c.server_id}/{c.id}{suffix}" for c in CELLS]


def loop_files():
    return [f"{RESULTS}/loops/{c.server_id}/{c.id}.json" for c in CELLS]


def gate_files():
    return [
        f"{RESULTS}/gates/{sid}/{gate}.json" for sid in SERVER_IDS for gate in GATES
    ]


# The losslessness check (rules/lossless.smk): speculative config -> its twin
LOSSLESS_CHECKS = EXP.lossless_checks()


def lossless_verdict_file(spec_id):
    return f"{RESULTS}/lossless/{LOSSLESS_CHECKS[spec_id]}/verdict-{spec_id}.json"


def lossless_files():
    return [lossless_verdict_file(s) for s in LOSSLESS_CHECKS]


def lossless_settings_of(wildcards):
    # the sampling settings of the config's cells, each checked
    return EXP.sampling_settings(wildcards.server_id)


def lossless_of_cell(wildcards):
    # the verdict a cell's status reads (a speculative config with a twin), else nothing
    if wildcards.server_id in LOSSLESS_CHECKS:
        return lossless_verdict_file(wildcards.server_id)
    return []


def gate_settings(wildcards):
    """What a gate's verdict depends on besides the server: its settings and the chat template's options
    (a changed one runs the gate again)."""
    return {
        "settings": EXP.raw["gates"][wildcards.gate],
        "chat_template_kwargs": EXP.client.chat_template_kwargs,
    }


def reference_files():
    wanted = set(EXP.raw.get("reference", {}).get("cells", []))
    return [
        f"{RESULTS}/reference/{c.server_id}/{c.id}.json"
        for c in CELLS
        if c.id in wanted
    ]


def startup_files():
    return [f"{RESULTS}/servers/{sid}/launch.json" for sid in SERVER_IDS]


def model_manifest(name):
    return f"{MODELS}/{name}/speedmatrix-model.json"


def server_models(wildcards):
    return [model_manifest(n) for n in EXP.server(wildcards.server_id).model_names]


def model_spec(wildcards):
    if wildcards.model not in EXP.models:
        raise WorkflowError(
            f"model {wildcards.model!r} is not in {EXP.path} (models: {', '.join(EXP.models)})"
        )
    return EXP.models[wildcards.model]


def cell_id_of(kind):
    # a rule per kind matches the rest of the id (cell_key_pattern, from Cell.id's parts and the kinds' own endings)
    def cell_id(wildcards):
        return f"{kind}-{wildcards.cell_key}"

    return cell_id


def server_spec(wildcards):
    # everything a server config's launch is built from: a change re-writes its launch spec,
    # which re-measures its cells
    srv = EXP.server(wildcards.server_id)
    return {
        "runtime": EXP.runtime,
        "models": {n: EXP.models[n] for n in srv.model_names},
        "server": {k: v for k, v in vars(srv).items() if k != "workloads"},
    }


def cell_spec_of(kind):
    # the cell's whole definition (requests, output cap, duration, its dataset's spec): a change re-measures it
    def cell_spec(wildcards):
        cell = EXP.cell(wildcards.server_id, cell_id_of(kind)(wildcards))
        spec = EXP.dataset_of(cell)
        return {**cell.as_dict(), **({"dataset": spec} if spec else {})}

    return cell_spec


def dataset_files():
    # the experiment's local dataset files
    return [s["path"] for s in (EXP.raw.get("datasets") or {}).values() if "path" in s]


def datasets_lock_file():
    # the datasets' lock, where the experiment has datasets
    return [str(RUN.datasets_lock)] if EXP.raw.get("datasets") else []


def dataset_file_of(kind):
    # a cell's local dataset file: a changed file re-measures the cell
    def dataset_file(wildcards):
        spec = EXP.dataset_of(
            EXP.cell(wildcards.server_id, cell_id_of(kind)(wildcards))
        )
        return [spec["path"]] if spec and "path" in spec else []

    return dataset_file


# The order configs are measured in: as listed, a speculative config's twin after the configs it checks
# (the twin's verdict job scores their outputs: one start of it serves both)
SERVER_ORDER = EXP.server_order()


def cell_priority(wildcards):
    # All jobs of one server config before the next config's: one server
    # start per config (the scheduler runs the highest priority first).
    return 10 * (len(SERVER_ORDER) - SERVER_ORDER.index(wildcards.server_id))


# The server configs whose launch waits for a P2P check: tensor x pipeline parallel above one GPU. The
# others have no such job (on a cluster it would be an allocation of its own that checks nothing).
P2P_SERVER_IDS = [s.id for s in EXP.servers if s.gpus > 1]


def p2p_of(wildcards):
    if wildcards.server_id in P2P_SERVER_IDS:
        return f"{RESULTS}/servers/{wildcards.server_id}/p2p.json"
    return []


def server_gpus(wildcards):
    return EXP.server(wildcards.server_id).gpus


def server_gpu_model(wildcards):
    # the cluster's GPU model for a GPU config (config cluster.gpu_model): every job of its allocation asks the
    # same (SLURM gets --gpus=<model>:<N> once); none for a CPU config
    return (
        config["cluster"]["gpu_model"] if EXP.server(wildcards.server_id).gpus else ""
    )


def server_gpus_needed(wildcards):
    # tensor x pipeline parallel, whatever the device (the check decides what applies)
    return EXP.server(wildcards.server_id).parallel_size


def job_threads(wildcards):
    # A job that measures (cell, gate, reference) takes the whole machine locally
    # (Snakemake scales this down to --cores), or its share of it when a GPU pool
    # runs configs side by side; on a cluster, the CPUs of the server config's
    # allocation (config.yaml: cluster.job_threads). Evaluated per job, once the
    # executor is known.
    if for_cluster():
        return config["cluster"]["job_threads"]
    return 1024 if DEVICE_UNITS == 1 else max(1, workflow.cores // DEVICE_UNITS)


def placement_of(kind):
    # the node's GPU pool, this config's share and whether a job of this kind may
    # measure beside others (speedmatrix.serve.pool)
    def placement(wildcards):
        return sm_pool.placement(EXP, wildcards.server_id, kind, GPU_POOL).as_dict()

    return placement


def device_of(kind):
    # the `device` claim: the config's GPUs when it may measure beside others,
    # else the whole device (every unit)
    def device(wildcards):
        p = sm_pool.placement(EXP, wildcards.server_id, kind, GPU_POOL)
        return sm_pool.device_claim(p, DEVICE_UNITS)

    return device


def chart_outputs():
    # the PNG of every chart this experiment can have data for (with its caption); the
    # interactive charts live in report.html
    out = {}
    for chart in sm_charts.applicable(EXP):
        out[f"{chart.name}_png"] = report(
            f"{RESULTS}/charts/{chart.name}.png",
            caption=f"../docs/captions/{chart.name}.rst",
            category="Charts",
        )
    return out


# What every job that talks to a server config's server asks for (a cell of any kind, a gate, a reference
# round), written once for the three rules: the launch spec and runtime lock it reads, the resources it holds
# (the config's lane, the device or its GPUs, a cluster job's memory and time) and the params its JobContext
# is built from (jobs/job.py).
def server_job_input():
    return {
        "launch": f"{RESULTS}/servers/{{server_id}}/launch.json",
        "lock": str(RUN.runtime_lock),
    }


def server_job_resources(kind):
    return {
        **SERVER_LANES,
        "device": device_of(kind),
        # GPUs of the server config (tensor x pipeline parallel; 0 on a CPU runtime)
        "gpu": server_gpus,
        "gpu_model": server_gpu_model,
        "mem_mb": config["cluster"]["job_mem_mb"],
        "runtime": config["cluster"]["job_runtime_min"],
    }


def server_job_params(kind):
    return {
        "experiment": config["experiment"],
        "experiments_dir": config["experiments_dir"],
        "results_root": results_root,
        "idle_timeout_s": IDLE_TIMEOUT_S,
        "placement": placement_of(kind),
    }
