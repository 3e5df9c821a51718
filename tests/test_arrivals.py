"""Open-loop rate cells: seeded schedules, the window rule, and a client that cannot keep its schedule named as such.

The measurements here run against ``fault_server`` (a test fixture that streams at once), so the client is the
only thing that can fall behind; the default run's test measures rate cells on the real CPU vLLM.
"""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest
from test_client_faults import _measure

from fault_server import app
from speedmatrix import workloads
from speedmatrix.measure import arrivals
from speedmatrix.workloads import Cell


def rate_cell(rate: float, duration_s: float, arrival: str = "poisson", burstiness: float = 1.0,
              warmup_s: float = 0.0, lag_limit_ms: float = 100, max_tokens: int = 4) -> Cell:
    block = {"contexts": [32], "rates": [rate], "arrival": arrival, "burstiness": burstiness,
             "duration_s": duration_s, "warmup_s": warmup_s, "seed": 0, "lag_limit_ms": lag_limit_ms,
             "min_achieved": 0.9, "max_tokens": max_tokens, "corpus": "prose"}
    return workloads.get("rate").expand("manual", block)[0]


def test_schedules_are_seeded_and_shaped_by_their_arrival():
    poisson = arrivals.Arrival(rate=50, kind="poisson", duration_s=40)
    a, b = poisson.schedule(1), poisson.schedule(1)
    assert a == b and a != poisson.schedule(2)  # the same cell and repeat: the same schedule
    assert all(0 <= t < 40 for t in a) and a == sorted(a)
    assert abs(len(a) / 40 - 50) < 50 * 0.1  # about the rate
    assert abs(arrivals.gap_cv(a) - 1) < 0.1  # exponential gaps: CV 1
    const = arrivals.Arrival(rate=4, kind="constant", duration_s=2).schedule()
    assert const == pytest.approx([0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75])
    bursty = arrivals.Arrival(rate=50, kind="gamma", burstiness=0.25, duration_s=40).schedule()
    smooth = arrivals.Arrival(rate=50, kind="gamma", burstiness=4, duration_s=40).schedule()
    # gamma gaps of shape k have CV 1/sqrt(k): 2 for 0.25, 0.5 for 4
    assert arrivals.gap_cv(bursty) == pytest.approx(2, rel=0.15)
    assert arrivals.gap_cv(smooth) == pytest.approx(0.5, rel=0.15)


def test_rate_cells_are_named_by_rate_and_arrival():
    cell = rate_cell(2.5, 10, "gamma", 0.5)
    assert cell.id == "rate-ctx32-r2.5-gamma0.5" and cell.concurrency == 0
    assert re.fullmatch(workloads.cell_id_pattern(), cell.id)
    assert rate_cell(4, 10).id == "rate-ctx32-r4-poisson"
    assert cell.as_dict()["options"]["burstiness"] == 0.5  # recorded in the cell


def test_a_rate_the_client_keeps_is_valid_with_its_lag_and_rates():
    cell = rate_cell(20, 2, "constant", warmup_s=0.5)
    result, records = _measure(cell, app())
    assert result["status"] == "valid", result.get("status_reason")
    assert len(records) == 40 and result["warmup_requests"] == 10 and result["counted_requests"] == 30
    assert [r.phase for r in records[:10]] == ["warmup"] * 10 and all(r.counted for r in records[10:])
    assert result["offered_rate_rps"] == 20 and result["scheduled_rate_rps"] == pytest.approx(20)
    assert result["achieved_rate_rps"] == pytest.approx(20, rel=0.1)
    assert 0 <= result["schedule_lag_p50_ms"] <= result["schedule_lag_p95_ms"] <= result["schedule_lag_max_ms"] < 100
    # every request's scheduled and actual send time is kept
    assert all(r.start >= r.scheduled for r in records)
    assert np.allclose([r.scheduled for r in records], [i / 20 for i in range(40)])
    # a latency target is judged on the counted requests only, over the cell's measured span
    from speedmatrix.jobs import cells
    from speedmatrix.measure import slo

    table = cells.request_table(records, {"server_id": "manual", "cell_id": cell.id})
    scope = cell.kind.slo_scope(result)
    (judged,) = slo.for_cell(table, result, [slo.Target("loose", ttft_ms=60_000)], *scope)
    assert judged["judged_requests"] == 30 and judged["attainment"] == 1


def test_a_client_driven_past_what_it_can_send_is_client_bound():
    """20,000 requests a second for a twentieth of a second: this process cannot open connections that fast, so the
    cell's figure would be the client's. It is measured, kept, and marked client-bound with the reason."""
    cell = rate_cell(20_000, 0.05, "constant", lag_limit_ms=20)
    result, records = _measure(cell, app())
    assert result["status"] == "client_bound"
    assert "p95 send lag" in result["status_reason"] and result["schedule_lag_p95_ms"] > 20
    assert len(records) == 1_000 and result["completed"] > 0
    json.dumps(result)  # the verdict and its figures are a cell's JSON


def test_saturation_is_a_queue_that_grows_through_the_window():
    """Synthetic request times: a server that keeps up (every request 0.2 s, TTFT 20 ms) and one whose queue grows
    (each request waits longer than the one before). The verdict, and Little's law on the steady one."""
    steady = [(i * 0.1, i * 0.1 + 0.001, i * 0.1 + 0.021, i * 0.1 + 0.2) for i in range(60)]
    v = arrivals.saturation(steady)
    assert not v["saturated"] and v["littles_law_ratio"] == pytest.approx(1, abs=0.05)
    growing = [(i * 0.1, i * 0.1, i * 0.1 + 0.02 + 0.05 * i, i * 0.1 + 0.2 + 0.05 * i) for i in range(60)]
    v = arrivals.saturation(growing)
    assert v["saturated"] and v["ttft_trend_rho"] > 0.99 and v["ttft_growth"] > 2 and v["in_flight_growth"] > 1.5
    assert "queue grew" in v["saturation_reason"] and v["littles_law_ratio"] < 0.8
    assert not arrivals.saturation(growing[:5])["saturated"]  # too few requests to say
    # a queue built before the window (in the warm-up): TTFT from 7 s to 14 s over a 7 s window, in flight from
    # about 1,100 to 2,200 (512 requests a second on an H200 at about 155 a second served) is saturated, though
    # its TTFT less than doubles
    deep = [(i / 512, i / 512, i / 512 + 7 + i / 512, i / 512 + 7.4 + i / 512) for i in range(3584)]
    v = arrivals.saturation(deep)
    assert v["ttft_growth"] < 2 and v["saturated"], v
    # a TTFT that rises a little at a load the server keeps up with stays unsaturated (in flight flat)
    flat = [(i * 0.1, i * 0.1, i * 0.1 + 0.02 + 0.0005 * i, i * 0.1 + 0.2) for i in range(60)]
    assert not arrivals.saturation(flat)["saturated"]


def test_the_reference_asks_every_client_for_the_same_arrivals(tmp_path):
    """A rate cell in the reference: vllm bench serve (and AIPerf, GuideLLM) gets every request of the schedule
    at the rate, with the cell's gamma shape (Poisson: 1) and no concurrency cap; speedmatrix measures it without a
    warm-up, as the others are asked. Constant arrivals (which vllm bench serve does not draw), and a rate cell no
    named client can send, are refused before any server starts."""
    import dataclasses
    from pathlib import Path

    import yaml

    from conftest import REPO
    from speedmatrix import peers
    from speedmatrix.jobs import reference
    from speedmatrix.plan import experiment

    cell = rate_cell(4, 5, "gamma", burstiness=0.5, warmup_s=1)
    load = peers.Load(**cell.kind.reference_load(cell), concurrency=0, url="http://x", model="m", tokenizer="/t",
                      context=32, max_tokens=4, seed=1)
    assert load.requests == len(arrivals.Arrival(4, "gamma", 0.5, 5, 1).schedule(1))
    vb = peers.table()["vllm_bench_serve"].argv(["py"], load, tmp_path, None)
    assert vb[vb.index("--request-rate"):][:4] == ["--request-rate", "4", "--burstiness", "0.5"]
    assert "--max-concurrency" not in vb and vb[vb.index("--num-prompts") + 1] == str(load.requests)
    assert cell.kind.for_reference(cell).opts["warmup_s"] == 0
    data = yaml.safe_load((REPO / "config/experiments/tiny-cpu.yaml").read_text())
    data["workloads"]["rate"].update(arrival="constant")
    data["reference"] = {"cells": ["rate-ctx128-temp0-fp0.5-r2-constant"], "clients": ["vllm_bench_serve"]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(experiment.ConfigError, match="constant arrivals: vllm bench serve draws Poisson or gamma"):
        experiment.load("c", tmp_path)
    # a client that cannot send a rate cell's arrivals sits that cell out (its other cells it measures): GuideLLM
    # draws Poisson gaps only, so it sits out a gamma cell; with no client that can, the reference is refused.
    # (guidellm looked for in this Python, where it is not: its import check answers at once.)
    data["workloads"]["rate"].update(arrival="gamma", burstiness=0.5)
    rate_id = "rate-ctx128-temp0-fp0.5-r2-gamma0.5"
    data["workloads"]["capacity"] = [data["workloads"]["capacity"], {"contexts": [128], "concurrency": [4],
                                                                     "requests": 8, "max_tokens": 16}]
    data["reference"] = {"cells": [rate_id, "capacity-ctx128-c4"], "clients": ["vllm_bench_serve", "guidellm"],
                         "python": {"guidellm": sys.executable}}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    exp = experiment.load("p", tmp_path)
    assert not any("open-loop" in p for p in reference.problems(exp))
    assert reference.clients_for(exp.cell("base", rate_id), ["vllm_bench_serve", "guidellm", "aiperf"]) == (
        ["vllm_bench_serve", "aiperf"], ["guidellm"])
    assert reference.clients_for(exp.cell("base", "capacity-ctx128-c4"), ["vllm_bench_serve", "guidellm"]) == (
        ["vllm_bench_serve", "guidellm"], [])
    data["reference"]["clients"] = ["guidellm"]
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(data))
    found = reference.problems(experiment.load("q", tmp_path))
    assert any("none of guidellm can send these cells' open-loop arrivals" in p for p in found), found
    # Poisson arrivals: every client sends them (AIPerf as its poisson pattern, GuideLLM as its poisson profile)
    poisson = dataclasses.replace(load, burstiness=1.0)
    ap = peers.table()["aiperf"].argv(["py"], poisson, tmp_path, None)
    assert ap[ap.index("--request-rate"):][:4] == ["--request-rate", "4", "--arrival-pattern", "poisson"]
    assert "--concurrency" not in ap
    ap = peers.table()["aiperf"].argv(["py"], load, tmp_path, None)
    assert ap[ap.index("--arrival-pattern"):][:4] == ["--arrival-pattern", "gamma", "--arrival-smoothness", "0.5"]
    gl = peers.table()["guidellm"].argv(["py"], poisson, tmp_path, None)
    assert json.loads(Path(gl[gl.index("--scenario") + 1]).read_text())["spec"]["profile"] == {"kind": "poisson",
                                                                                             "rate": 4}
    with pytest.raises(ValueError, match="Poisson arrivals only"):
        peers.table()["guidellm"].argv(["py"], load, tmp_path, None)


def test_a_rate_search_doubles_then_bisects_to_its_resolution_and_keeps_its_interval():
    """A stand-in server that meets the target below 10 requests a second: the search doubles 1, 2, 4, 8, 16,
    then bisects between 8 and 16 until the bracket is within a tenth; the answer lies under 10 and the
    interval holds the true limit. A client that falls behind stops the search and says so."""
    import asyncio

    from speedmatrix.measure import slo
    from speedmatrix.measure.client import RequestRecord
    from speedmatrix.workloads.rate_search import search_rates

    def records(rate: float) -> list:
        ttft = 0.05 if rate < 10 else 2.0
        return [RequestRecord(index=i, worker=0, prompt_tokens=8, start=i / rate, first_token=i / rate + ttft,
                              end=i / rate + ttft + 0.1, chunk_times=[i / rate + ttft], chunk_tokens=[4])
                for i in range(20)]

    async def probe(rate: float, k: int):
        return records(rate), 20 / rate, {"client_bound": False, "client_bound_reason": None,
                                          "achieved_rate_rps": rate, "schedule_lag_p95_ms": 1.0}

    target = slo.Target("t", percentile=90, ttft_ms=500)
    found = asyncio.run(search_rates(probe, target, 1, 64, 0.1, progress=lambda m: None))
    rates = [s["rate"] for s in found["steps"]]
    assert rates[:5] == [1, 2, 4, 8, 16] and found["answer"] < 10 <= found["interval"][1]
    assert found["interval"][1] - found["answer"] <= 0.1 * found["answer"] and found["stopped"] is None

    async def falls_behind(rate: float, k: int):
        bound = rate >= 4
        return records(rate), 20 / rate, {"client_bound": bound, "client_bound_reason": "p95 send lag" if bound
                                          else None, "achieved_rate_rps": rate, "schedule_lag_p95_ms": 1.0}

    found = asyncio.run(search_rates(falls_behind, target, 1, 64, 0.1, progress=lambda m: None))
    assert found["answer"] == 2 and found["steps"][-1]["holds"] is None and "4 req/s" in found["stopped"]


def test_a_rate_search_cell_runs_in_one_job_against_a_server():
    """On fault_server (a test fixture that answers at once) every rate holds: the search doubles to its bound."""
    block = {"contexts": [32], "slo": "loose", "target": {"ttft_ms": 60_000, "percentile": 90}, "max_rate": 16,
             "start_rate": 4, "resolution": 0.1, "duration_s": 0.5, "arrival": "poisson", "burstiness": 1.0,
             "seed": 0, "lag_limit_ms": 100, "min_achieved": 0.5, "max_tokens": 4, "corpus": "prose"}
    cell = workloads.get("rate_search").expand("manual", block)[0]
    assert cell.id == "rate_search-ctx32-for-loose" and re.fullmatch(workloads.cell_id_pattern(), cell.id)
    result, records = _measure(cell, app())
    steps = result["slo_rate_search_steps"]
    assert [s["rate"] for s in steps] == [4, 8, 16] and all(s["holds"] for s in steps)
    assert result["slo_max_rate"] == 16 and result["slo_max_rate_interval"] == [16, None]
    assert {r.phase for r in records} == {"step1", "step2", "step3"} and len(records) == result["num_requests"]
    assert sorted(r.index for r in records) == list(range(len(records)))


def test_a_rate_sweep_runs_synchronous_then_throughput_then_rates_between():
    """GuideLLM's sweep profile on fault_server (a test fixture that answers at once): the two closed-loop ends, then
    open-loop rates spaced evenly strictly between their request rates, each judged on the block's target."""
    from speedmatrix.workloads.rate_sweep import rates_between

    assert rates_between(2, 10, 3) == [4, 6, 8] and rates_between(5, 5, 3) == [] and rates_between(1, 2, 0) == []
    block = {"contexts": [32], "slo": "loose", "target": {"ttft_ms": 60_000, "percentile": 90}, "max_concurrency": 4,
             "requests": 6, "rates": 2, "duration_s": 0.6, "warmup_s": 0.1, "arrival": "constant", "burstiness": 1.0,
             "seed": 0, "lag_limit_ms": 100, "min_achieved": 0.5, "max_tokens": 4, "corpus": "prose"}
    cell = workloads.get("rate_sweep").expand("manual", block)[0]
    assert cell.id == "rate_sweep-ctx32-for-loose" and re.fullmatch(workloads.cell_id_pattern(), cell.id)
    result, records = _measure(cell, app())
    steps = result["rate_sweep_steps"]
    assert [s["profile"] for s in steps] == ["synchronous", "throughput", "rate1", "rate2"]
    assert [s["concurrency"] for s in steps[:2]] == [1, 4] and steps[0]["requests"] == 6 and steps[1]["requests"] == 8
    low, high = result["sweep_sync_rate_rps"], result["sweep_max_rate_rps"]
    assert low == pytest.approx(steps[0]["request_rate_rps"]) and high == pytest.approx(steps[1]["request_rate_rps"])
    assert [s["offered_rate_rps"] for s in steps[2:]] == rates_between(low, high, 2)
    for s in steps:
        assert s["attainment"] == 1 and s["holds"] and s["goodput_tok_s"] > 0
    # every request kept, each step's own phase; the open-loop steps' first tenth of a second is warm-up
    assert {r.phase for r in records} <= {"synchronous", "throughput", "rate1", "rate1warmup", "rate2", "rate2warmup"}
    assert len(records) == result["num_requests"] and sorted(r.index for r in records) == list(range(len(records)))
    assert all(r.scheduled is not None for r in records if r.phase.startswith("rate"))
    row = cell.kind.matrix_fields(cell.as_dict(), result, {})
    assert row["sweep_slo"] == "loose" and json.loads(row["rate_sweep_steps"]) == steps
