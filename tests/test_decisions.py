"""From matrix to decision: targets, goodput, the Pareto frontier, the best config, and the SLO search.

Every case is built so that its answer is known by hand; nothing here starts a server.
"""

from __future__ import annotations

import asyncio

import pandas as pd
import pytest

from speedmatrix.core.errors import ConfigError
from speedmatrix.judge import decide
from speedmatrix.measure import slo
from speedmatrix.measure.client import RequestRecord
from speedmatrix.workloads import slo_search


def requests(rows):
    """(start_s, end_s, ttft_ms, output_tokens, error, cut) -> a requests table as cells.request_table writes."""
    return pd.DataFrame(rows, columns=["start_s", "end_s", "ttft_ms", "output_tokens", "error", "cut_at_window_end"])


# ---- targets ---------------------------------------------------------------------------------------

def test_a_preset_is_mlperfs_limits_at_p99_and_keys_beside_it_override():
    t = slo.target("chat", {"preset": "mlperf-llama3.1-8b-interactive"})
    assert (t.ttft_ms, t.tpot_ms, t.e2e_ms, t.percentile) == (500, 30, None, 99)
    t = slo.target("chat", {"preset": "mlperf-llama2-70b", "percentile": 90, "e2e_ms": 10_000})
    assert (t.ttft_ms, t.tpot_ms, t.e2e_ms, t.percentile) == (2000, 200, 10_000, 90)
    assert t.describe() == "p90: TTFT ≤ 2000 ms, TPOT ≤ 200 ms, E2E ≤ 10000 ms (mlperf-llama2-70b)"


def test_a_target_without_a_limit_or_with_an_unknown_preset_is_a_config_error():
    with pytest.raises(ConfigError, match="slos.empty"):
        slo.target("empty", {"percentile": 99})
    with pytest.raises(ConfigError, match="unknown preset 'mlperf-gpt5'"):
        slo.target("x", {"preset": "mlperf-gpt5"})


def test_an_slo_search_naming_a_target_the_experiment_lacks_is_refused_before_any_server(tmp_path):
    import yaml

    from conftest import REPO
    from speedmatrix.plan import experiment

    data = yaml.safe_load((REPO / "config/experiments/tiny-cpu.yaml").read_text())
    data["workloads"]["slo_search"]["slo"] = "batch"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"bad.yaml: key 'servers\[0\].workloads.slo_search.slo': 'batch' is not"):
        experiment.load("bad", tmp_path)


# ---- per request and per cell ------------------------------------------------------------------------

def test_goodput_counts_only_the_requests_that_met_every_limit():
    t = slo.target("t", {"ttft_ms": 100, "tpot_ms": 10, "percentile": 50})
    reqs = requests([
        (0.0, 1.0, 50, 101, None, False),    # TTFT 50, TPOT (1000-50)/100 = 9.5: met
        (0.0, 1.0, 150, 101, None, False),   # TTFT 150: missed
        (0.0, 2.0, 50, 101, None, False),    # TPOT 19.5: missed
        (0.0, 0.5, None, 0, "boom", False),  # failed: missed
        (0.0, 0.05, None, 0, None, True),    # cut 50 ms in, before a token: cannot be judged
    ])
    assert slo.judge(slo.request_figures(reqs), t).tolist() == [True, False, False, False, None]
    got = slo.evaluate(reqs, t, window_s=2.0)
    assert (got["judged_requests"], got["met_requests"], got["attainment"]) == (4, 1, 0.25)
    assert got["goodput_rps"] == 0.5 and got["goodput_tok_s"] == 101 / 2.0
    # the tokens of the met request over all the output tokens: a useful token cost the energy of 3 (303 / 101)
    assert got["goodput_token_share"] == pytest.approx(101 / 303)
    # p50 by nearest rank: TTFTs 50, 50, 150 and the failure (late) -> 50; TPOTs 8.5, 9.5, 19.5, late -> 9.5
    assert got["p_ttft_ms"] == 50 and got["p_tpot_ms"] == 9.5 and got["slo_met"] is True


def test_the_percentile_rule_fails_when_the_tail_is_late_even_if_most_requests_met():
    t = slo.target("t", {"ttft_ms": 100, "percentile": 90})
    reqs = requests([(0.0, 1.0, 50, 10, None, False)] * 8 + [(0.0, 1.0, 500, 10, None, False)] * 2)
    got = slo.evaluate(reqs, t, window_s=1.0)
    assert got["attainment"] == 0.8 and got["slo_met"] is False and got["p_ttft_ms"] == 500


def test_a_request_cut_past_a_limit_missed_it_and_one_with_a_single_token_has_no_tpot():
    t = slo.target("t", {"ttft_ms": 100, "tpot_ms": 5, "e2e_ms": 300, "percentile": 99})
    reqs = requests([
        (0.0, 0.4, None, 0, None, True),   # cut at 400 ms with no token: TTFT and E2E already missed
        (0.0, 0.2, 40, 30, None, True),    # cut at 200 ms: TTFT 40, TPOT 160/29 = 5.5 ms: missed
        (0.0, 0.05, 40, 1, None, False),   # one token, done in 50 ms: met (no TPOT to miss)
    ])
    assert slo.judge(slo.request_figures(reqs), t).tolist() == [False, False, True]


def test_goodput_over_repeats_is_their_median_with_an_interval():
    t = slo.target("t", {"ttft_ms": 100})
    reqs = requests([(0.0, 1.0, 50, 100, None, False)] * 4).assign(repeat=[1, 1, 2, 2])
    result = {"measured_s": 3.0, "repeat_figures": [{"measured_s": 1.0}, {"measured_s": 2.0}]}
    row = slo.for_cell(reqs, result, [t])[0]
    assert row["goodput_repeats"] == [200.0, 100.0] and row["goodput_tok_s"] == 150.0
    assert row["goodput_tok_s_ci_low"] == 0.0 and row["goodput_tok_s_ci_high"] > 600  # two repeats: t = 12.7


# ---- the frontier and the best config ----------------------------------------------------------------

def matrix(rows):
    """Rows give the per-user rate; avg_active_requests is derived from it (per user = total / active)."""
    cols = ["experiment", "server_id", "cell_id", "workload", "context_tokens", "concurrency", "status",
            "tok_s_per_user", "total_tok_s", "gpus", "ttft_ms", "sweep", "sweep_point"]
    m = pd.DataFrame([r + [None] * (len(cols) - len(r)) for r in rows], columns=cols)
    m["avg_active_requests"] = m["total_tok_s"] / m["tok_s_per_user"].astype(float)
    return m.drop(columns="tok_s_per_user")


def test_the_frontier_is_the_points_no_other_beats_on_both_axes():
    m = matrix([
        ["e", "a", "decode-ctx128-c1", "decode", 128, 1, "valid", 100.0, 100.0, 1],   # fastest per user
        ["e", "a", "decode-ctx128-c8", "decode", 128, 8, "valid", 60.0, 480.0, 1],    # frontier
        ["e", "b", "decode-ctx128-c8", "decode", 128, 8, "valid", 50.0, 400.0, 1],    # beaten by a/c8
        ["e", "b", "decode-ctx128-c64", "decode", 128, 64, "valid", 10.0, 1280.0, 2],  # 640 per GPU: frontier
        ["e", "b", "capacity-ctx128-c16", "capacity", 128, 16, "valid", 5.0, 640.0, 1],  # ties a y, lower x: beaten
        ["e", "a", "decode-ctx128-c64", "decode", 128, 64, "looped", 90.0, 9000.0, 1],  # not usable
        ["e", "a", "latency-ctx128", "latency", 128, 1, "valid", 500.0, 500.0, 1],  # not a throughput cell
    ])
    points = decide.frontier(decide.pareto_points(m))
    on = points[points["on_frontier"]]
    assert list(on["point"]) == ["b · decode-ctx128-c64", "a · decode-ctx128-c8", "a · decode-ctx128-c1"]
    assert set(points["point"]) == {"a · decode-ctx128-c1", "a · decode-ctx128-c8", "b · decode-ctx128-c8",
                                    "b · decode-ctx128-c64", "b · capacity-ctx128-c16"}
    assert points.set_index("point").loc["b · decode-ctx128-c64", "tok_s_per_gpu"] == 640.0


def test_on_the_cpu_a_server_counts_as_one_and_a_user_gets_the_rate_over_the_requests_in_flight():
    per = decide.per_gpu(pd.Series([300.0, 300.0]), pd.Series([0, 2]))
    assert per.tolist() == [300.0, 150.0]
    assert decide.per_user(pd.Series([800.0, 100.0]), pd.Series([8.0, 0.0])).tolist()[0] == 100.0
    assert pd.isna(decide.per_user(pd.Series([100.0]), pd.Series([0.0]))[0])


def decisions(rows):
    cols = ["experiment", "server_id", "cell_id", "workload", "context_tokens", "concurrency", "status", "slo",
            "slo_definition", "slo_met", "goodput_tok_s", "goodput_tok_s_ci_low", "goodput_tok_s_ci_high"]
    return pd.DataFrame(rows, columns=cols)


def test_the_best_config_is_the_highest_goodput_where_the_target_holds_with_the_runner_up():
    d = decisions([
        ["e", "a", "c1", "decode", 512, 1, "valid", "chat", "p99", True, 100.0, 90.0, 110.0],
        ["e", "a", "c8", "decode", 512, 8, "valid", "chat", "p99", True, 600.0, 550.0, 650.0],
        ["e", "a", "c64", "decode", 512, 64, "valid", "chat", "p99", False, 2000.0, None, None],  # misses
        ["e", "b", "c8", "decode", 512, 8, "valid", "chat", "p99", True, 500.0, None, None],
        ["e", "b", "c16", "decode", 512, 16, "unstable", "chat", "p99", True, 550.0, None, None],
        ["e", "c", "c1", "decode", 512, 1, "valid", "chat", "p99", False, 50.0, None, None],
        ["e", "a", "c1", "decode", 2048, 1, "valid", "chat", "p99", False, 80.0, None, None],
    ])
    best = decide.best_configs(d).set_index("context_tokens")
    r = best.loc[512]
    assert (r.best_server, r.concurrency, r.goodput_tok_s, r.goodput_tok_s_ci_low) == ("a", 8, 600.0, 550.0)
    assert (r.runner_up_server, r.runner_up_concurrency, r.runner_up_goodput_tok_s) == ("b", 16, 550.0)
    assert r.margin_pct == pytest.approx(600 / 550 * 100 - 100)
    assert (r.configs_meeting, r.configs_tried) == (2, 3)
    assert pd.isna(best.loc[2048].best_server) and best.loc[2048].configs_meeting == 0


def test_the_best_sweep_point_per_concurrency_and_whether_the_repeats_can_tell():
    m = matrix([
        ["e", "spec-1", "latency-ctx512", "latency", 512, 1, "valid", None, 90.0, 0, None, "spec", "k=1"],
        ["e", "spec-2", "latency-ctx512", "latency", 512, 1, "valid", None, 120.0, 0, None, "spec", "k=2"],
        ["e", "spec-4", "latency-ctx512", "latency", 512, 1, "valid", None, 100.0, 0, None, "spec", "k=4"],
        ["e", "spec-1", "decode-ctx512-c8", "decode", 512, 8, "valid", None, 700.0, 0, None, "spec", "k=1"],
        ["e", "spec-4", "decode-ctx512-c8", "decode", 512, 8, "valid", None, 500.0, 0, None, "spec", "k=4"],
        ["e", "base", "decode-ctx512-c8", "decode", 512, 8, "valid", None, 900.0, 0, None, None, None],
    ]).assign(total_tok_s_ci_low=[None, 110.0, None, None, None, None],
              total_tok_s_ci_high=[None, 130.0, 125.0, None, None, None])
    best = decide.best_sweep_points(m).set_index("concurrency")
    assert (best.loc[1].best_point, best.loc[1].runner_up_point, best.loc[1].overlapping) == ("k=2", "k=4", True)
    assert (best.loc[8].best_point, best.loc[8].tok_s, best.loc[8].overlapping) == ("k=1", 700.0, False)


# ---- the search -------------------------------------------------------------------------------------

def fake_server(capacity: int, seen: list):
    """A server whose TTFT is 50 ms up to ``capacity`` requests at once and 500 ms beyond."""
    async def probe(c: int, n: int, k: int):
        seen.append(c)
        ttft = 0.05 if c <= capacity else 0.5
        return 1.0, [RequestRecord(index=i, worker=0, prompt_tokens=8, start=0.0, first_token=ttft, end=ttft + 0.1,
                                   chunk_times=[ttft, ttft + 0.1], chunk_tokens=[1, 1], finish_reason="length")
                     for i in range(n)]
    return probe


@pytest.mark.parametrize("capacity, upper, answer, probed", [
    (11, 64, 11, [1, 2, 4, 8, 16, 12, 10, 11]),  # doubling to the first miss, then bisection
    (64, 64, 64, [1, 2, 4, 8, 16, 32, 64]),      # holds up to the bound: stops there
    (0, 64, 0, [1]),                             # misses at one request: no load holds
    (5, 6, 5, [1, 2, 4, 6, 5]),                  # the bound is not a power of two
])
def test_the_search_doubles_then_bisects_to_the_highest_concurrency_that_holds(capacity, upper, answer, probed):
    t = slo.target("t", {"ttft_ms": 100})
    seen: list = []
    got, steps, batches = asyncio.run(slo_search.search(fake_server(capacity, seen), t, upper, 4, 0.1,
                                                        progress=lambda _m: None))
    assert got == answer and seen == probed
    assert [s.concurrency for s in steps] == probed and all(s.holds == (s.concurrency <= capacity) for s in steps)
    assert all(s.requests == max(4, 2 * s.concurrency) for s in steps)


def test_a_step_near_a_limit_is_measured_twice_and_decided_on_both_batches():
    t = slo.target("t", {"ttft_ms": 100})
    seen: list = []

    async def probe(c, n, k):
        seen.append(c)
        ttft = 0.095 if c == 1 else 0.5  # 95 ms against a 100 ms limit: within the 10 % margin
        return 1.0, [RequestRecord(index=i, worker=0, prompt_tokens=8, start=0.0, first_token=ttft, end=ttft,
                                   chunk_times=[ttft], chunk_tokens=[1], finish_reason="length") for i in range(n)]

    got, steps, _ = asyncio.run(slo_search.search(probe, t, 8, 4, 0.1, progress=lambda _m: None))
    assert got == 1 and seen == [1, 1, 2]
    assert steps[0].rechecked and steps[0].requests == 8 and not steps[1].rechecked


def test_pareto_across_runs_names_each_point_by_its_run(tmp_path):
    from speedmatrix import cli

    one = matrix([["h200", "a", "decode-ctx1K-c8", "decode", 1024, 8, "valid", 100.0, 800.0, 1],
                  ["h200", "a", "decode-ctx1K-c16", "decode", 1024, 16, "valid", 25.0, 900.0, 1],
                  ["h200", "a", "decode-ctx1K-c64", "decode", 1024, 64, "valid", 20.0, 1280.0, 1]])
    two = matrix([["h200x2", "tp2", "decode-ctx1K-c8", "decode", 1024, 8, "valid", 150.0, 1200.0, 2],
                  ["h200x2", "tp2", "decode-ctx1K-c64", "decode", 1024, 64, "valid", 30.0, 1920.0, 2]])
    for name, m in (("h200", one), ("h200x2", two)):
        (tmp_path / name).mkdir()
        m.assign(status=m["status"]).to_parquet(tmp_path / name / "matrix.parquet")
    out = tmp_path / "pareto"
    assert cli.main(["pareto", str(tmp_path / "h200"), str(tmp_path / "h200x2"), "--out", str(out)]) == 0
    text = (out / "pareto.md").read_text()
    # per GPU, TP 2's figures are halved: its c8 (150 a user, 600 a GPU) and c64 (30, 960) stay on the
    # frontier beside h200's c8 (100, 800) and c64 (20, 1,280); h200's c16 (25, 900) is beaten by TP 2's c64
    rows = [line for line in text.splitlines() if line.startswith("| h200")]
    assert [r.split(" | ")[0:3] for r in rows] == [["| h200x2", "tp2", "decode-ctx1K-c8"],
                                                   ["| h200", "a", "decode-ctx1K-c8"],
                                                   ["| h200x2", "tp2", "decode-ctx1K-c64"],
                                                   ["| h200", "a", "decode-ctx1K-c64"]]
    assert "4 of 5 cells are on the frontier" in text
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG" and (out / "pareto-report.html").exists()
    assert cli.main(["pareto", str(tmp_path / "nowhere")]) == 2


def test_one_search_doubles_then_bisects_over_whole_and_real_loads():
    """The engine every searching kind runs: the loads it steps through for a known capacity, over whole numbers
    (concurrency, users) and real ones (rate, time scale), and a step that cannot be judged stops it."""
    from speedmatrix.workloads import search as engine

    def run(capacity, start, upper, load, unjudged=None):
        seen = []

        async def step(x):
            seen.append(x)
            return None if unjudged is not None and x >= unjudged else x <= capacity

        return asyncio.run(engine.search(step, start, upper, load)), seen

    found, seen = run(5, 1, 64, engine.COUNT)
    assert seen == [1, 2, 4, 8, 6, 5] and (found.answer, found.failed, found.stopped_at) == (5, 6, None)
    found, seen = run(100, 1, 64, engine.COUNT)  # never fails: stops at the bound, nothing failed
    assert seen == [1, 2, 4, 8, 16, 32, 64] and (found.answer, found.failed) == (64, None)
    found, seen = run(0, 1, 64, engine.COUNT)  # the first step fails: no bisection below it
    assert seen == [1] and (found.answer, found.failed) == (0, 1)
    found, seen = run(3.3, 1.0, 64.0, engine.Load(integer=False, resolution=0.1))
    assert seen == [1.0, 2.0, 4.0, 3.0, 3.5, 3.25] and (found.answer, found.failed) == (3.25, 3.5)
    found, seen = run(100, 1.0, 64.0, engine.Load(integer=False, resolution=0.1), unjudged=8)
    assert seen == [1.0, 2.0, 4.0, 8.0] and (found.answer, found.failed, found.stopped_at) == (4.0, None, 8.0)
