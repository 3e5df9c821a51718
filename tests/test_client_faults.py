"""The client ends every request with a reason: stalls, HTTP errors, malformed events, dropped connections."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from fault_server import PROMPTS, app
from speedmatrix.core.settings import ClientSettings
from speedmatrix.measure.client import RequestOptions, RequestRecord, closed_loop, stream_completion
from speedmatrix.workloads import Cell


async def one(mode: str, stall_timeout_s: float = 0.5, opts: RequestOptions | None = None) -> RequestRecord:
    """One request to the fixture; the model name picks its behaviour."""
    async with TestServer(app()) as srv:
        url = str(srv.make_url("")).rstrip("/")
        async with aiohttp.ClientSession() as s:
            rec = RequestRecord(index=0, worker=0, prompt_tokens=4, start=0.0)
            t0 = time.monotonic()
            await stream_completion(s, url, mode, [1, 2, 3, 4], opts or RequestOptions(8, stall_timeout_s), rec, t0)
            return rec


def test_ok_stream_counts_tokens_from_usage():
    rec = asyncio.run(one("ok"))
    assert rec.error is None and rec.finish_reason == "length" and rec.output_tokens == 8


@pytest.mark.parametrize("mode, reason", [("stall", "stalled"), ("malformed", "malformed event"),
                                          ("drop", "connection"), ("http500", "HTTP 500"),
                                          ("json", "unexpected content type application/json")])
def test_faults_end_the_request_with_a_reason(mode, reason):
    t0 = time.monotonic()
    rec = asyncio.run(one(mode))
    assert rec.error and rec.error.startswith(reason), rec.error
    assert time.monotonic() - t0 < 10  # ended, did not hang
    if mode in ("stall", "malformed"):
        assert rec.output_tokens >= 2  # what arrived before the fault is kept


def test_closed_loop_stops_at_the_window_end():
    async def go():
        async with TestServer(app()) as srv:
            url = str(srv.make_url("")).rstrip("/")
            return await closed_loop(url, "ok", lambda i: [1, 2], concurrency=3, duration_s=0.5,
                                     opts=RequestOptions(max_tokens=10_000))
    t0 = time.monotonic()
    _, recs = asyncio.run(go())
    assert time.monotonic() - t0 < 5
    assert len(recs) == 3 and all(r.cut_at_window_end for r in recs)


def test_a_watch_ends_the_window_early_and_its_requests_are_cut_there():
    """The precision rule's way out of a window: ``Window.close`` from the watch beside the loop ends it at once; the
    requests in flight are cut there (as at the window's end) and no token after it counts."""
    async def watch(window, records):
        await asyncio.sleep(0.3)
        window.close()

    async def go():
        async with TestServer(app()) as srv:
            url = str(srv.make_url("")).rstrip("/")
            return await closed_loop(url, "ok", lambda i: [1, 2], concurrency=3, duration_s=30.0,
                                     opts=RequestOptions(max_tokens=10_000), watch=watch)
    t0 = time.monotonic()
    window, recs = asyncio.run(go())
    assert time.monotonic() - t0 < 5
    assert 0.3 <= window.closed_at < 1.0 and window.end - window.t0 == pytest.approx(window.closed_at)
    assert len(recs) == 3 and all(r.cut_at_window_end and r.error is None for r in recs)
    assert all(r.output_tokens > 10 and max(r.chunk_times) <= window.closed_at for r in recs)


def test_fixed_count_keeps_concurrency_and_counts_every_request():
    from speedmatrix.measure import stats
    from speedmatrix.measure.client import fixed_count

    async def go():
        async with TestServer(app()) as srv:
            url = str(srv.make_url("")).rstrip("/")
            return await fixed_count(url, "ok", lambda i: [1, 2, 3], requests=10, concurrency=3,
                                     opts=RequestOptions(max_tokens=8))
    wall, recs = asyncio.run(go())
    assert [r.index for r in recs] == list(range(10))
    assert {r.worker for r in recs} == {0, 1, 2}
    s = stats.fixed(recs, wall)
    assert s["completed"] == 10 and s["total_output_tokens"] == 80
    assert s["output_throughput"] == 80 / wall
    assert 2.0 <= s["avg_active_requests"] <= 3.0
    assert s["p95_ttft_ms"] >= s["median_ttft_ms"] > 0


def _measure(cell, fixture_app, client_cfg=None, dataset=None):
    from speedmatrix.jobs import cells

    async def go():
        async with TestServer(fixture_app) as srv:
            url = str(srv.make_url("")).rstrip("/")
            settings = ClientSettings.from_config(client_cfg or {"stall_timeout_s": 5})
            return await cells.measure(cell, cells.MeasureInput(url, "ok", settings, progress=lambda m: None,
                                                                dataset=dataset))
    return asyncio.run(go())


def test_a_server_without_vllm_metrics_gets_absent_counters_and_the_cell_still_runs():
    from speedmatrix.measure.metrics import DELTA_KEYS

    cell = Cell("manual", "capacity", context_tokens=64, concurrency=2, max_tokens=8, requests=4)
    fixture = app()
    result, records = _measure(cell, fixture)
    assert result["status"] == "valid" and result["server_metrics"] == "absent"
    assert len(records) == 4 and result["total_output_tokens"] == 32
    # every counter field is present and recorded as absent (None), not guessed
    for key in (*DELTA_KEYS, "kv_cache_size_tokens", "token_count_gap", "server_running_mean"):
        assert key in result and result[key] is None, key
    # the prompts were sized exactly with the server's /tokenize, and sent as text
    assert all(r.prompt_tokens == 64 and r.prompt_format == "text" for r in records)
    assert result["prompt_format"] == "text" and result["prompts_sent_as_token_ids"] == 0
    # 63 characters of text: with the BOS the server adds, exactly the 64-token context
    assert [len(p) for p in fixture[PROMPTS]] == [63] * 4


def test_a_busy_server_fails_the_cell_before_anything_is_sent():
    from speedmatrix.jobs.cells import CellError

    cell = Cell("manual", "capacity", context_tokens=64, concurrency=2, max_tokens=8, requests=4)
    with pytest.raises(CellError, match=r"busy with requests that are not this cell's \(3 running"):
        _measure(cell, app(running=3), {"stall_timeout_s": 5, "busy_wait_s": 0.5})


def test_without_per_event_usage_the_final_usage_makes_the_count_exact():
    rec = asyncio.run(one("multi", opts=RequestOptions(max_tokens=8, usage_per_chunk=False)))
    # 4 events of 2 tokens: counted 1 each, then made to add up to the server's total of 8
    assert rec.error is None and len(rec.chunk_times) == 4
    assert rec.output_tokens == 8 and rec.tokens_reconciled == 4
    assert rec.chunk_tokens[0] == 1 and sorted(rec.chunk_tokens[1:]) == [2, 2, 3]


@pytest.mark.parametrize("stop", [True, False])
def test_the_online_watch_sees_a_loop_and_can_end_the_request(stop):
    rec = asyncio.run(one("loop", opts=RequestOptions(max_tokens=20_000, stop_looping=stop)))
    assert rec.error is None
    # "and it said again " is 18 characters in 3 tokens: 4,096 characters of loop is about 700 tokens
    assert rec.loop_detected_at_token is not None and 600 < rec.loop_detected_at_token < 2000
    if stop:
        assert rec.stopped_for_loop and rec.finish_reason == "loop" and rec.output_tokens < 2000
    else:
        assert not rec.stopped_for_loop and rec.output_tokens == 20_000
    assert len(rec.chunk_chars) == len(rec.chunk_tokens) and sum(rec.chunk_chars) == len(rec.text)


@pytest.mark.parametrize("cell", [
    Cell("manual", "prefill", context_tokens=32, concurrency=1, max_tokens=1, requests=2),
    Cell("manual", "latency", context_tokens=32, concurrency=1, max_tokens=8, requests=2),
    Cell("manual", "decode", context_tokens=32, concurrency=2, max_tokens=8, duration_s=0.5),
    Cell("manual", "prefix_cache", context_tokens=64, concurrency=2, max_tokens=8, requests=3, shared_prefix=0.5),
], ids=lambda c: c.workload)
def test_every_cell_kind_runs_against_any_openai_compatible_server(cell):
    result, records = _measure(cell, app())
    assert result["status"] == "valid" and records and not any(r.error for r in records)
    assert all(r.prompt_tokens == cell.context_tokens and r.prompt_format == "text" for r in records)
    if cell.workload == "prefix_cache":
        assert {r.phase for r in records} == {"cold", "warm"} and set(result["passes"]) == {"cold", "warm"}


@pytest.mark.parametrize("answer, reason", [("html", "answered text/html, not application/json"),
                                            ("nofield", "answered JSON without tokens")])
def test_an_unexpected_tokenize_answer_ends_the_cell_with_a_named_reason(answer, reason):
    from speedmatrix.jobs.cells import CellError

    cell = Cell("manual", "capacity", context_tokens=64, concurrency=2, max_tokens=8, requests=4)
    with pytest.raises(CellError, match=reason):
        _measure(cell, app(tokenize_answer=answer))


def test_repeats_measure_a_cell_several_times_in_one_job():
    cell = Cell("manual", "capacity", context_tokens=64, concurrency=2, max_tokens=8, requests=4, repeats=3)
    fixture = app()
    result, records = _measure(cell, fixture)
    assert len(records) == 12 and sorted(r.index for r in records) == list(range(12))
    assert [r.repeat for r in records].count(3) == 4
    assert len(result["repeat_figures"]) == 3 and result["num_requests"] == 12
    assert result["output_throughput"] == pytest.approx(
        sorted(r["output_throughput"] for r in result["repeat_figures"])[1])  # the median of three
    low, high = result["output_throughput_ci95"]
    assert low <= result["output_throughput"] <= high and result["output_throughput_cv"] >= 0
    # every repeat's prompts are its own (no cached prefix is served from an earlier repeat)
    assert len(set(fixture[PROMPTS])) == 12


def test_an_slo_search_runs_in_one_job_and_keeps_every_step():
    from speedmatrix import workloads

    # a target the fixture meets at every load: the search doubles up to its bound and stops there
    cell = workloads.get("slo_search").manual_cell(32, 8, 4, 8, 0, 0, "prose", target={"ttft_ms": 5000})
    assert cell.id == "slo_search-ctx32-c8-for-manual"
    result, records = _measure(cell, app())
    steps = result["slo_search_steps"]
    assert [s["concurrency"] for s in steps] == [1, 2, 4, 8] and all(s["holds"] for s in steps)
    assert result["slo_max_concurrency"] == 8 and result["slo_search_phase"] == "step4"
    assert [s["requests"] for s in steps] == [4, 4, 8, 16] and len(records) == result["num_requests"] == 32
    assert sorted(r.index for r in records) == list(range(32))
    assert {r.phase for r in records} == {"step1", "step2", "step3", "step4"}


def test_bench_refuses_an_slo_search_without_a_target(capsys):
    from speedmatrix import cli

    assert cli.main(["measure", "--url", "http://127.0.0.1:9", "--model", "m", "--workload", "slo_search",
                     "--context", "32", "--out", "/dev/null"]) == 2
    assert "slo_search needs a latency target" in capsys.readouterr().err


def test_every_measurement_has_the_client_check_and_a_busy_client_is_client_bound():
    """The client check: a normal measurement's figures, and a client process kept busy on purpose (a callback that
    holds its event loop 60 ms of every 80, burning CPU) is Client-bound, with the reason and whose time it was."""
    from speedmatrix.jobs import cells
    from speedmatrix.measure import clientcheck

    cell = Cell("manual", "decode", context_tokens=64, concurrency=4, max_tokens=32, duration_s=1.5)
    result, records = _measure(cell, app())
    assert result["status"] == "valid", result.get("status_reason")
    assert all(result[k] is not None for k in clientcheck.FIGURES)
    assert 0 <= result["client_loop_lag_p50_ms"] <= result["client_loop_lag_p95_ms"] <= result["client_loop_lag_max_ms"]
    assert result["client_loop_lag_p95_ms"] < 50 and 0 < result["client_cpu_share"]
    # each request's body left after it began, and its time inside the client is that gap
    assert all(r.sent is not None and r.sent >= r.start for r in records)
    assert all(r.client_wait_s == pytest.approx(r.sent - r.start) for r in records)

    async def busy_client():
        async def hog():
            while True:
                t = time.perf_counter()
                while time.perf_counter() - t < 0.06:
                    pass
                await asyncio.sleep(0.02)

        async with TestServer(app()) as srv:
            url = str(srv.make_url("")).rstrip("/")
            task = asyncio.create_task(hog())
            try:
                return await cells.measure(cell, cells.MeasureInput(
                    url, "ok", ClientSettings.from_config({"stall_timeout_s": 5}), progress=lambda m: None))
            finally:
                task.cancel()

    result, _ = asyncio.run(busy_client())
    assert result["status"] == "client_bound"
    assert result["client_loop_lag_p95_ms"] > 50 and result["client_cpu_share"] > 0
    assert "event loop ran late" in result["status_reason"] and "the client used" in result["status_reason"]
    # the limits are the experiment's: a looser one lets the same figures pass
    loose = ClientSettings.from_config({"max_loop_lag_p95_ms": 1000, "max_cpu_share": 2, "max_stall_share": 1})
    assert clientcheck.verdict(result, loose, 1.5) is None
