"""The nightly recipe (docs/nightly.sh, docs/nightly.md) end to end on a recorded run (docs/results/
h200-tiny-trained-spec: every cell's JSON and requests kept), its measuring step replaced by copying a prepared
night into place: a first night sets the baseline, a clean night passes and moves it on, a slowed night fails with
the slower status, a release whose servers did not start fails with the lost status and its cause, a night whose
client fell behind fails with the measurement status. No engine runs here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO
from speedmatrix.history import store
from speedmatrix.history.gate import Outcome

RECORDED = REPO / "docs" / "results" / "h200-tiny-trained-spec"
SLOWED = ("mtp2", "decode-ctx128-c16-temp0.7")
CAUSE = "vLLM exited with code 1 during start-up: RuntimeError: Engine core initialization failed"


def night(root: Path, name: str, slow: bool = False, client_bound: bool = False) -> Path:
    """A copy of the recorded run measured "on another night" (each cell started later: another run id)."""
    out = root / name
    shutil.copytree(RECORDED, out, ignore=shutil.ignore_patterns("first-run", "logs", "servers", "charts"))
    for doc_path in (out / "cells").glob("*/*.json"):
        doc = json.loads(doc_path.read_text())
        doc["result"]["started_at"] = f"2026-12-0{len(name)}T0{len(name)}:00:00+0000 {name}"
        doc_path.write_text(json.dumps(doc))
    if slow:
        path = out / "cells" / SLOWED[0] / f"{SLOWED[1]}.requests.parquet"
        reqs = pd.read_parquet(path)
        reqs["ttft_ms"] *= 1.4
        reqs["end_s"] = reqs["start_s"] + (reqs["end_s"] - reqs["start_s"]) * 1.4
        reqs.to_parquet(path)
    if client_bound:
        matrix = pd.read_parquet(out / "matrix.parquet")
        matrix.loc[(matrix["server_id"] == SLOWED[0]) & (matrix["cell_id"] == SLOWED[1]), "status"] = "client_bound"
        matrix.to_parquet(out / "matrix.parquet")
    (out / "run-summary.json").write_text(json.dumps({"succeeded": True, "failed": 0, "jobs": 40, "causes": []}))
    return out


def failed_start(root: Path) -> Path:
    """A release whose servers did not start: no cell, the run summary with the engine's reason."""
    out = root / "failed"
    out.mkdir()
    (out / "run-summary.json").write_text(json.dumps({
        "succeeded": False, "failed": 2, "jobs": 40, "written_at": "2026-12-06T06:00:00+0000",
        "causes": [{"cause": CAUSE, "jobs": ["launch_server base", "launch_server mtp2"]}]}))
    return out


@pytest.fixture(scope="module")
def nights(tmp_path_factory):
    root = tmp_path_factory.mktemp("nights")
    return {"first": night(root, "a"), "clean": night(root, "bb"), "again": night(root, "eeee"),
            "slow": night(root, "ccc", slow=True),
            "failed": failed_start(root), "client": night(root, "ddddd", client_bound=True)}


def run_night(source: Path, results: Path) -> subprocess.CompletedProcess:
    """docs/nightly.sh with its measuring step: the prepared night copied to results/<experiment>."""
    env = {**os.environ, "EXPERIMENT": "h200-tiny-trained-spec", "RESULTS": str(results),
           "BIN": str(Path(sys.executable).parent), "RUN": f"cp -r {source} {results}/h200-tiny-trained-spec"}
    return subprocess.run(["sh", str(REPO / "docs" / "nightly.sh")], env=env, capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def baseline(store_path: Path) -> str:
    """The run the store's baseline tag names now."""
    return store.tag_names(store_path)["baseline-h200-tiny-trained-spec"]


def test_the_nightly_recipe_gates_each_night_with_its_own_status(nights, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    store_path = results / "history.sqlite"
    verdict = results / "verdict-h200-tiny-trained-spec" / "verdict.json"

    first = run_night(nights["first"], results)
    assert first.returncode == 0, first.stderr
    base_id = baseline(store_path)
    assert "is the first baseline" in first.stdout and base_id in first.stdout

    clean = run_night(nights["clean"], results)  # the same figures on another night: passes, the baseline moves
    assert clean.returncode == Outcome.PASS, clean.stdout[-2000:] + clean.stderr
    assert json.loads(verdict.read_text())["outcome"] == "pass"
    assert baseline(store_path) != base_id and "is the baseline now" in clean.stdout
    again = run_night(nights["again"], results)  # a third night: the run-to-run spread has the runs it needs
    assert again.returncode == Outcome.PASS, again.stdout[-2000:] + again.stderr
    moved = baseline(store_path)

    slow = run_night(nights["slow"], results)
    assert slow.returncode == Outcome.SLOWER, slow.stderr
    doc = json.loads(verdict.read_text())
    assert doc["found"]["slower"] == ["/".join(SLOWED)] and baseline(store_path) == moved  # not moved
    assert (results / "verdict-h200-tiny-trained-spec" / "junit.xml").read_text().count("<failure") == 1

    failed = run_night(nights["failed"], results)
    assert failed.returncode == Outcome.LOST, failed.stderr
    doc = json.loads(verdict.read_text())
    assert doc["outcome"] == "lost" and any(CAUSE in c for c in doc["new_run_causes"])
    assert CAUSE in doc["headline"] and "the new run lost" in failed.stderr

    client = run_night(nights["client"], results)
    assert client.returncode == Outcome.MEASUREMENT, client.stderr
    doc = json.loads(verdict.read_text())
    assert doc["found"] == {"measurement": ["/".join(SLOWED)]} and baseline(store_path) == moved
