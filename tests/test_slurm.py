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
    """The SLURM job ids in each config's cell results (``where``: the cells, or the durable store, which
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
# server start per config and run, job ids in the results, a failed cell rerun alone.
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
    exp_dir = one_server_experiment(work, "small", {}, SERVERS)
    res = work / "results" / "small"
    # no retry: the failure must reach the end of this run (with the profile's retry the
    # resubmitted group restores the finished cells and measures the failed one at once)
    proc = subprocess.Popen(slurm_cmd(work, "small", exp_dir, "--retries", "0"), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    victim = None
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and victim is None:
            measured = {p.parent.name for p in res.glob("store/base/*/*.json")}
            for log in res.glob("logs/cells/base/decode-*.log"):
                if measured and log.stem not in measured and "decode:" in log.read_text():
                    victim = log.stem
            time.sleep(0.3)
        assert victim, "no second cell of base started"
        stored = {p: p.read_bytes() for p in res.glob("store/base/*/*")}
        broker = json.loads((res / "servers/base/broker.json").read_text())
        time.sleep(1.0)
        os.kill(broker["vllm_pid"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    first = {"returncode": proc.returncode, "out": out, "left": wait_no_vllm(60),
             "jobs": {**job_ids(res, "store/*/*/*.json"), **job_ids(res)},
             "starts": starts(res), "victim": victim, "stored": stored}
    again = run(slurm_cmd(work, "small", exp_dir))
    return work, exp_dir, first, again, wait_no_vllm(60)


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
    # since, base's finished cells restored from the store and kept byte for byte)
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
    # the durable store kept every finished measurement, byte for byte
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
    assert sum("restored from the durable store" in t for t in rerun_logs) == len(
        [p for p in stored if p.suffix == ".json"])
