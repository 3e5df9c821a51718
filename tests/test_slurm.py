"""The workflow on a real SLURM (a single-node cluster started by .ci/start-slurm).

Marked ``slurm``: CI starts SLURM and runs these; they fail (never skip) when
SLURM is not there, so a broken cluster set-up cannot pass silently.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import LIFECYCLE_WORKLOADS, REPO, one_server_experiment, starts, wait_no_vllm
from speedmatrix.plan import experiment
from speedmatrix.workloads import names as workload_names

pytestmark = pytest.mark.slurm


def server_rules() -> list[str]:
    return [*workload_names(), "lossless_outputs", "lossless"]


def slurm_cmd(work: Path, experiment_name: str, experiments_dir: Path | str = "config/experiments",
              *extra: str) -> list[str]:
    import sys

    return [
        sys.executable, "-m", "snakemake", "--workflow-profile", "profiles/slurm",
        "--config", f"experiment={experiment_name}", f"results_dir={work / 'results'}",
        f"models_dir={work / 'models'}", f"experiments_dir={experiments_dir}",
        # the GPU model as docs/cluster.md says (a GRES type of the cluster: the CI node declares h100)
        "cluster={gpu_model: h100}",
        "--default-resources", "slurm_partition=debug", "slurm_account=none", "runtime=30", "mem_mb=2000",
        # every cell kind has its rule (rules/cells.smk), and the losslessness check two (rules/lossless.smk): two
        # CPUs and 6 GB for each (this host's node has 2 CPUs: a group asking for more is never scheduled)
        "--set-threads", *(f"{k}=2" for k in server_rules()),
        "--set-resources", *(f"{k}:mem_mb=6000" for k in server_rules()),
        # the jobs run on this very host: the cluster's shared file system is the local disk
        "--shared-fs-usage", "input-output", "persistence", "software-deployment", "source-cache", "sources",
        "storage-local-copies", *extra,
    ]


@pytest.fixture(scope="module")
def slurm_up():
    if shutil.which("sinfo") is None:
        pytest.fail("SLURM is not installed: run .ci/start-slurm (CI does) before `pytest -m slurm`")
    out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True)
    if out.returncode != 0 or not ({"idle", "mix", "alloc"} & set(out.stdout.split())):
        pytest.fail(f"no SLURM node is up ({out.stdout.strip()} {out.stderr.strip()}): run .ci/start-slurm")


def run(cmd, timeout=1500):
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def job_ids(res: Path, where: str = "cells/*/*.json") -> dict[str, set[str]]:
    """The SLURM job ids in each config's cell results (``where``: the cells, or the measurement archive, which
    keeps a failed group's finished cells after Snakemake removed their outputs)."""
    out: dict[str, set[str]] = {}
    for f in res.glob(where):
        doc = json.loads(f.read_text())
        out.setdefault(doc["cell"]["server_id"], set()).add(doc["provenance"]["scheduler"].get("SLURM_JOB_ID"))
    return out


# One workflow on SLURM, then its rerun, for both tests (each SLURM run costs minutes of submissions and
# polls): two server configs (one with the MTP drafter); the base config's decode cells are long enough to
# kill its server during one. The first run loses that cell; the rerun measures it alone. The local
# end-to-end test measures the default's 38 cells; here SLURM's own part is checked: one allocation and one
# server start per config and run, job ids in the results, a failed cell rerun alone. The experiment is a GPU
# user's (`device: gpu`, one GPU a config, the GPU model from `cluster.gpu_model`): the CI node declares two
# h100 GPUs as a generic resource without devices, so each allocation asks for and is granted one, while the
# server runs vLLM for the CPU (tests/vllm_cpu_in_a_gpu_allocation.sh).
GPU_RUNTIME = {"device": "gpu", "command": [str(REPO / "tests/vllm_cpu_in_a_gpu_allocation.sh"), "--model"]}
SERVERS = [
    {"id": "base", "workloads": {**LIFECYCLE_WORKLOADS,
                                 "latency": {"contexts": [128], "requests": 2, "max_tokens": 16}}},
    {"id": "mtp2", "speculative": {"model": "tiny-gemma4-trained-mtp", "num_speculative_tokens": 2},
     "workloads": {"latency": {"contexts": [128], "requests": 2, "max_tokens": 16},
                   "decode": {"contexts": [128], "concurrency": [1, 4], "duration_s": 2, "max_tokens": 32}}},
]


@pytest.fixture(scope="module")
def slurm_runs(slurm_up, tmp_path_factory):
    """The first run (base's server killed during its second measured cell), what it left, and the rerun."""
    work = tmp_path_factory.mktemp("slurm")
    exp_dir = one_server_experiment(work, "small", {}, SERVERS, runtime=GPU_RUNTIME)
    res = work / "results" / "small"
    plan = run(slurm_cmd(work, "small", exp_dir, "--dry-run", "--quiet", "rules", "progress"), timeout=300)
    # no retry: the failure must reach the end of this run (with the profile's retry the
    # resubmitted group restores the finished cells and measures the failed one at once)
    proc = subprocess.Popen(slurm_cmd(work, "small", exp_dir, "--retries", "0"), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    victim = None
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and victim is None:
            measured = {p.parent.name for p in res.glob("archive/base/*/*.json")}
            for log in res.glob("logs/cells/base/decode-*.log"):
                if measured and log.stem not in measured and "decode:" in log.read_text():
                    victim = log.stem
            time.sleep(0.3)
        assert victim, "no second cell of base started"
        stored = {p: p.read_bytes() for p in res.glob("archive/base/*/*")}
        broker = json.loads((res / "servers/base/broker.json").read_text())
        time.sleep(1.0)
        os.kill(broker["vllm_pid"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    first = {"returncode": proc.returncode, "out": out, "left": wait_no_vllm(60), "plan": plan,
             "granted": granted_gpus(ids_of(res)),
             "jobs": {**job_ids(res, "archive/*/*/*.json"), **job_ids(res)},
             "starts": starts(res), "victim": victim, "stored": stored}
    again = run(slurm_cmd(work, "small", exp_dir))
    return work, exp_dir, first, again, wait_no_vllm(60)


def ids_of(res: Path) -> set[str]:
    return {i for v in {**job_ids(res, "archive/*/*/*.json"), **job_ids(res)}.values() for i in v if i}


def granted_gpus(ids: set[str]) -> dict[str, str]:
    """What SLURM granted each job (its TRES as scontrol shows a job, kept MinJobAge=300 s after it ends)."""
    out = {}
    for i in ids:
        shown = subprocess.run(["scontrol", "show", "job", i], capture_output=True, text=True).stdout
        out[i] = next((w for w in shown.split() if w.startswith("TresPerJob=")), "")
    return out


def test_the_plan_lists_the_allocations_a_gpu_user_asks_for(slurm_runs):
    plan = slurm_runs[2]["plan"]
    assert plan.returncode == 0, (plan.stdout + plan.stderr)[-3000:]
    rows = {ln.split()[0]: ln.split() for ln in plan.stdout.splitlines() if ln.startswith(("  base ", "  mtp2 "))}
    assert set(rows) == {"base", "mtp2"}, plan.stdout
    # server config, jobs, GPUs, CPUs (the profile's set-threads), memory, time (the sum of the jobs' minutes)
    assert rows["base"][2:5] == ["1", "x", "h100"] and rows["base"][5] == "2", rows
    assert "debug" in rows["base"] and "none" in rows["base"]
    assert "warning: the partition is empty" not in plan.stdout
    assert plan.stdout.count("jobs would run:") == 1


def test_gpu_configs_ask_for_and_get_their_gpus(slurm_runs):
    work, _, first, _, _ = slurm_runs
    # each allocation asked for one h100 and was granted it; every cell saw it
    assert first["granted"] and all(t == "TresPerJob=gres:gpu:h100:1" for t in first["granted"].values()), \
        first["granted"]
    m = pd.read_parquet(work / "results" / "small" / "matrix.parquet")
    cells = [json.loads(p.read_text()) for p in (work / "results" / "small").glob("cells/*/*.json")]
    assert cells and all(c["provenance"]["scheduler"].get("SLURM_GPUS_ON_NODE") == "1" for c in cells)
    assert len(m) == len(cells)


def test_two_configs_on_slurm(slurm_runs):
    work, exp_dir, first, again, left = slurm_runs
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert left == []
    res = work / "results" / "small"
    exp = experiment.load("small", exp_dir)
    m = pd.read_parquet(res / "matrix.parquet")
    assert len(m) == len(exp.cells()) == 7
    assert (res / "report.md").exists() and (res / "charts/heatmap.png").exists()
    # one allocation per server config, a different one for each config (the first run: mtp2 untouched
    # since, base's finished cells restored from the archive and kept byte for byte)
    ids = first["jobs"]
    assert set(ids) == {s.id for s in exp.servers} == {"base", "mtp2"}
    assert all(len(v) == 1 and None not in v for v in ids.values()), ids
    assert len({next(iter(v)) for v in ids.values()}) == len(ids)
    assert job_ids(res)["mtp2"] == ids["mtp2"]
    # one server start per config and allocation: mtp2 once; base once in each run's allocation
    assert first["starts"]["mtp2"] == 1 and starts(res) == {"mtp2": 1, "base": first["starts"]["base"] + 1}
    assert m.slurm_job_id.notna().all()


def test_failed_cell_is_rerun_alone_on_slurm(slurm_runs):
    work, exp_dir, first, again, left = slurm_runs
    res = work / "results" / "small"
    victim, stored = first["victim"], first["stored"]
    assert first["returncode"] != 0
    assert first["left"] == []
    # the measurement archive kept every finished measurement, byte for byte
    assert stored and not any(p.parent.name == victim for p in stored)

    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert left == []
    m = pd.read_parquet(res / "matrix.parquet")
    # every cell measured (a decode window the client could not read in time on 2 cores is Client-bound: measured)
    assert set(m.status) <= {"valid", "looped", "unstable", "client_bound"}
    # only the failed cell was measured again: the others are the stored bytes
    for p, data in stored.items():
        assert p.read_bytes() == data
    redone = json.loads((res / "cells/base" / f"{victim}.json").read_text())
    assert redone["provenance"]["scheduler"]["SLURM_JOB_ID"] not in first["jobs"].get("base", set())
    # the rerun was one allocation; its cells that had been measured were restored, not measured
    rerun_logs = [p.read_text() for p in res.glob("logs/cells/base/*.log")]
    assert sum("restored from the measurement archive" in t for t in rerun_logs) == len(
        [p for p in stored if p.suffix == ".json"])
