# Shared helpers: the experiment, its cells, and named input functions.
import os
from pathlib import Path

from snakemake_interface_executor_plugins.settings import ExecMode

from speedmatrix import charts as sm_charts
from speedmatrix import experiment as sm_experiment
from speedmatrix import preflight as sm_preflight
from speedmatrix import runtimes as sm_runtimes
from speedmatrix import server as sm_server
from speedmatrix import summary as sm_summary
from speedmatrix import workloads as sm_workloads

try:
    EXP = sm_experiment.load(config["experiment"], config["experiments_dir"])
except sm_experiment.ConfigError as err:
    raise WorkflowError(f"speedmatrix: {err}") from None

RESULTS = f"{config['results_dir']}/{EXP.name}"
MODELS = config["models_dir"]
SERVER_IDS = [s.id for s in EXP.servers]
# the workload kinds, one rule each (rules/bench.smk), from the registry
WORKLOADS = sm_workloads.names()
GATES = list(EXP.raw.get("gates", {}))
CELLS = EXP.cells()
PACKAGES_SHA256 = sm_runtimes.packages_digest()
IDLE_TIMEOUT_S = float(config.get("server_idle_timeout_s", 900))
# What a measurement depends on besides its cell and server: a change reruns the cells.
# The loop thresholds only when they end requests early (client.stop_looping).
MEASURED_WITH = {
    "client": EXP.client,
    "loops": EXP.loops if EXP.client.get("stop_looping") else None,
}

# The servers this workflow starts are owned by its main process (on a
# cluster: by the Snakemake process that runs a group job in its allocation):
# when it ends, however it ends, their brokers stop them (docs/decisions/0001).
if workflow.is_main_process or workflow.exec_mode == ExecMode.REMOTE:
    sm_server.claim_ownership(workflow.is_main_process)


wildcard_constraints:
    server_id="[A-Za-z0-9][A-Za-z0-9_.-]*",
    cell_id=sm_workloads.cell_id_pattern(),
    # a cell id without its kind (each kind has its rule, rules/bench.smk)
    cell_key=sm_workloads.CELL_KEY_PATTERN,
    model="[A-Za-z0-9][A-Za-z0-9_.-]*",
    gate="smoke|structured_json|tool_calls",


def results_root(wildcards):
    # the results root (config results_dir): the device lock and the registry of
    # running servers live there (speedmatrix.job.JobContext)
    return config["results_dir"]


def stop_servers():
    stopped = sm_server.stop_all(config["results_dir"])
    if stopped:
        print(f"speedmatrix: stopped {stopped} server(s)")


def measuring_jobs():
    # every job of the run that checks or talks to a server: (name, output, log)
    jobs = []
    for sid in SERVER_IDS:
        jobs.append(
            (
                f"{sid} p2p_check",
                Path(f"{RESULTS}/servers/{sid}/p2p.json"),
                Path(f"{RESULTS}/logs/servers/{sid}.p2p.log"),
            )
        )
    for c in CELLS:
        name = f"{c.server_id}/{c.id}"
        jobs.append(
            (
                name,
                Path(f"{RESULTS}/cells/{name}.json"),
                Path(f"{RESULTS}/logs/cells/{name}.log"),
            )
        )
    for sid in SERVER_IDS:
        for gate in GATES:
            jobs.append(
                (
                    f"{sid} gate {gate}",
                    Path(f"{RESULTS}/gates/{sid}/{gate}.json"),
                    Path(f"{RESULTS}/logs/gates/{sid}/{gate}.log"),
                )
            )
    return jobs


def preflight():
    # before any job: what the run needs from this machine, one message per cause
    problems = sm_preflight.problems(EXP)
    if problems:
        raise WorkflowError("speedmatrix: before any job:\n  " + "\n  ".join(problems))
    for name in sm_preflight.api_keys(EXP):
        print(
            f"speedmatrix: {name} is not set: the servers of this run take a key generated for the run "
            "(kept in this process's environment, never written)"
        )


def finish_run():
    # the end of every run: servers stopped, then what ran and why anything failed
    stop_servers()
    if workflow.is_main_process:
        summary = sm_summary.write(Path(RESULTS), measuring_jobs())
        print(sm_summary.text(summary))


def cell_files(suffix):
    return [f"{RESULTS}/cells/{c.server_id}/{c.id}{suffix}" for c in CELLS]


def loop_files():
    return [f"{RESULTS}/loops/{c.server_id}/{c.id}.json" for c in CELLS]


def gate_files():
    return [
        f"{RESULTS}/gates/{sid}/{gate}.json" for sid in SERVER_IDS for gate in GATES
    ]


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
    srv = EXP.server(wildcards.server_id)
    names = [srv.model] + ([srv.speculative["model"]] if srv.speculative else [])
    return [model_manifest(n) for n in names]


def model_spec(wildcards):
    if wildcards.model not in EXP.models:
        raise WorkflowError(
            f"model {wildcards.model!r} is not in {EXP.path} (models: {', '.join(EXP.models)})"
        )
    return EXP.models[wildcards.model]


def cell_id_of(kind):
    def cell_id(wildcards):
        return f"{kind}-{wildcards.cell_key}"

    return cell_id


def server_spec(wildcards):
    # everything a server config's launch is built from: a change re-writes its launch spec,
    # which re-measures its cells
    srv = EXP.server(wildcards.server_id)
    return {
        "runtime": EXP.runtime,
        "models": {
            n: EXP.models[n]
            for n in [srv.model]
            + ([srv.speculative["model"]] if srv.speculative else [])
        },
        "server": {k: v for k, v in vars(srv).items() if k != "workloads"},
    }


def cell_spec_of(kind):
    # the cell's whole definition (requests, output cap, duration, ...): a change re-measures it
    def cell_spec(wildcards):
        return EXP.cell(wildcards.server_id, f"{kind}-{wildcards.cell_key}").as_dict()

    return cell_spec


def cell_priority(wildcards):
    # All cells of one server config before the next config's: one server
    # start per config (the scheduler runs the highest priority first).
    return 10 * (len(SERVER_IDS) - SERVER_IDS.index(wildcards.server_id))


def server_gpus(wildcards):
    return EXP.server(wildcards.server_id).gpus


def server_gpus_needed(wildcards):
    # tensor x pipeline parallel, whatever the device (the check decides what applies)
    srv = EXP.server(wildcards.server_id)
    return int(srv.args.get("tensor-parallel-size", 1)) * int(
        srv.args.get("pipeline-parallel-size", 1)
    )


def job_threads(wildcards):
    # A job that measures (cell, gate, reference) takes the whole machine locally
    # (Snakemake scales this down to --cores); on a cluster, the CPUs of the
    # server config's allocation (config.yaml: cluster.job_threads). Evaluated
    # per job, once the executor is known.
    return 1024 if workflow.local_exec else config["cluster"]["job_threads"]


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
