"""The seeds' -tiny variants run end to end on the real CPU vLLM, and each report shows its seed's tables.

One workflow run per variant (module-scoped); the assertions read its results. Each runs a lighter copy of
its twin: every server config, sweep point and cell of the twin (of seed 003's capacity grid its corners),
with shorter windows and output caps (``conftest.lighter_copy``). What these tests check is the seed's shape
(its sweeps, tables, gates, comparison); how a cell measures is what tests/test_engine_e2e.py checks on the
default run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from conftest import REPO, lighter_copy, run_snakemake, starts, wait_no_vllm
from speedmatrix.plan import experiment

pytestmark = pytest.mark.engine

API_KEY = "sk-speedmatrix-test-4f1d2c9b8a7e"


def run_tiny(tmp_path_factory, name, env=None, corners=False):
    work = tmp_path_factory.mktemp(name)
    exp_dir = lighter_copy(work, name, corners=corners)
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        proc = run_snakemake(work, experiment=name, experiments_dir=exp_dir)
    finally:
        os.environ.clear()
        os.environ.update(old)
    left = wait_no_vllm(30)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not left, f"vLLM processes outlived the workflow: {left}"
    res = work / "results" / name
    return res, pd.read_parquet(res / "matrix.parquet"), (res / "report.md").read_text()


@pytest.fixture(scope="module")
def seed000(tmp_path_factory, no_vllm_before):
    return run_tiny(tmp_path_factory, "seed000-gemma4-31b-nvfp4-mtp-tp2-tiny")


@pytest.fixture(scope="module")
def seed002(tmp_path_factory, no_vllm_before):
    return run_tiny(tmp_path_factory, "seed002-gemma4-26b-a4b-nvfp4-speed-matrix-tiny",
                    {"SPEEDMATRIX_API_KEY": API_KEY})


@pytest.fixture(scope="module")
def seed003(tmp_path_factory, no_vllm_before):
    # the capacity grid's corners (contexts 128 and 512, 1 and 128 at once): its c1 cells send their 128 requests
    # one after another, most of the run; the matched comparison, gates and targets are the point here
    return run_tiny(tmp_path_factory, "seed003-gemma4-capacity-c128-tiny", corners=True)


def test_seed000_tiny_sweep_tables(seed000):
    res, matrix, report = seed000
    exp = experiment.load("seed000-gemma4-31b-nvfp4-mtp-tp2-tiny")
    assert set(matrix["server_id"]) == {s.id for s in exp.servers}
    for title, head in [("## Speculative decoding sweep", "| Spec tokens | tok/s | Mean TTFT | Median TTFT | "
                         "Acceptance rate | Accept length |"),
                        ("## max-num-seqs sweep", "| max-num-seqs | tok/s |"),
                        ("## --max-num-batched-tokens sweep", "| batch | 256-tok TTFT | 1K-tok TTFT | tok/s |")]:
        assert title in report and head in report, (title, head)
    spec_rows = [line for line in report.split("## Speculative decoding sweep")[1].split("##")[0].splitlines()
                 if line.startswith("| 1 ") or line.startswith("| 2 ") or line.startswith("| 4 ")]
    assert len(spec_rows) == 3
    assert "### Prefix cache" in report and "Shared prefix 87.5% — warm" in report
    assert matrix.loc[matrix.server_id == "spec-2", "sweep_point"].iloc[0] == "speculative.num_speculative_tokens=2"
    assert (res / "charts" / "spec.png").stat().st_size > 0 and (res / "charts" / "prefix.png").stat().st_size > 0
    assert "![Speculative decoding sweep](charts/spec.png)" in report
    lock = json.loads((res / "models.lock").read_text())
    assert set(lock["models"]) == {"tiny-gemma4", "tiny-gemma4-mtp"}
    # max-num-seqs-16 is spec-4 again (the seed's own overlap): it measured on spec-4's server, not a start of its own
    assert starts(res) == {s.id: 1 for s in exp.servers if s.id != "max-num-seqs-16"}, starts(res)
    by_start = matrix.groupby("server_id").server_start_id.agg(set)
    assert by_start["max-num-seqs-16"] == by_start["spec-4"] and len(by_start["spec-4"]) == 1


def test_seed002_tiny_speed_matrix_tables_and_api_key(seed002):
    res, matrix, report = seed002
    assert "### Prefill" in report and "### Sustained decode" in report and "### All measurements" in report
    assert "| Context | 1 | 2 | 4 | 8 | 16 | 32 | 64 | 128 |" in report
    decode = matrix[matrix.workload == "decode"]
    assert len(decode) == 48 and (decode.status == "over_capacity").any() and (decode.status == "valid").any()
    assert (matrix.workload == "prefill").sum() == 6
    # the experiment names the seed's published matrix: the report shows it beside the run's
    assert "## Against the published matrix" in report and "**Status agreement: " in report
    # the key reached the server and the client (every cell measured) and no file
    launch = json.loads((res / "servers" / "main" / "launch.json").read_text())
    assert "{env:SPEEDMATRIX_API_KEY}" in launch["argv"]
    startup = json.loads((res / "servers" / "main" / "startup.json").read_text())
    assert startup["argv"][startup["argv"].index("--api-key") + 1] == "<redacted>"
    for path in res.rglob("*"):
        if path.is_file():
            assert API_KEY.encode() not in path.read_bytes(), path


def test_seed003_tiny_matched_comparison_gates_and_compare(seed003, tmp_path):
    res, matrix, report = seed003
    assert "## Quality gates" in report and "| Server config | Smoke | Structured JSON | Tool calls |" in report
    gates = [json.loads(p.read_text()) for p in res.glob("gates/*/*.json")]
    assert len(gates) == 2 * 3 and all(isinstance(g["passed"], bool) for g in gates)
    for g in gates:  # each verdict is in the report: PASS, or FAIL with its reason
        assert ("PASS" if g["passed"] else f"FAIL: {str(g['reason'])[:40]}") in report
    assert "## Matched comparison" in report and "| Model | Runner | c1 / 128 |" in report
    assert "Change against tiny-gemma4/v1" in report
    assert set(matrix.api) == {"chat"} and (matrix.status == "valid").all()
    assert set(matrix.context_tokens) == {128, 512} and set(matrix.concurrency) == {1, 128} and len(matrix) == 2 * 4
    # the seed's target: p95 TTFT of the capacity cells; the report names the best config at each context
    d = pd.read_parquet(res / "decisions.parquet")
    assert set(d.slo) == {"c128_p95_ttft"} and len(d) == len(matrix) and d.slo_met.notna().all()
    assert "### Best config per target" in report and "`c128_p95_ttft`" in report
    reqs = pd.read_parquet(res / "requests.parquet")
    # chat: the template's tokens come on top of the prompt text
    assert (reqs.server_prompt_tokens > reqs.prompt_tokens).all()

    proc = subprocess.run([sys.executable, "-m", "speedmatrix.cli", "compare", str(res), str(res), "--match", "cell",
                           "--server-a", "capacity-tiny-gemma4-v1", "--server-b", "capacity-tiny-gemma4-wide-v1",
                           "--out", str(tmp_path / "cmp"), "--json", str(tmp_path / "cmp.json")],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    verdict = json.loads((tmp_path / "cmp.json").read_text())  # regress's verdict and status, B against A
    assert proc.returncode == verdict["exit_status"] in (0, 1), proc.stderr
    judged = [r for r in verdict["rows"] if r["figure"] == "served_tok_s"]
    assert len(judged) == len(matrix) // 2 == 4 and all(r["change"] is not None for r in judged)
    pair = "| capacity-tiny-gemma4-v1 → capacity-tiny-gemma4-wide-v1 |"
    shown = [line for line in proc.stdout.split("## The matrix's figures")[1].splitlines() if line.startswith(pair)]
    assert len(shown) == 4 and all("%" in r for r in shown)  # the matrix's figures: one row a cell both ran
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 0
