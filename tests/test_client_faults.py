"""The client ends every request with a reason: stalls, HTTP errors, malformed events, dropped connections."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from fault_server import app
from speedmatrix.client import RequestRecord, closed_loop, stream_completion


async def one(mode: str, stall_timeout_s: float = 0.5) -> RequestRecord:
    async with TestServer(app()) as srv:
        url = str(srv.make_url("")).rstrip("/")
        async with aiohttp.ClientSession() as s:
            rec = RequestRecord(index=0, worker=0, prompt_tokens=4, start=0.0)
            t0 = time.monotonic()
            await stream_completion(s, url, mode, [1, 2, 3, 4], 8, rec, t0, stall_timeout_s)
            return rec


def test_ok_stream_counts_tokens_from_usage():
    rec = asyncio.run(one("ok"))
    assert rec.error is None and rec.finish_reason == "length" and rec.output_tokens == 8


@pytest.mark.parametrize("mode, reason", [("stall", "stalled"), ("malformed", "malformed event"),
                                          ("drop", "connection"), ("http500", "HTTP 500")])
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
            return await closed_loop(url, "ok", lambda i: [1, 2], concurrency=3, duration_s=0.5, max_tokens=10_000)
    t0 = time.monotonic()
    _, recs = asyncio.run(go())
    assert time.monotonic() - t0 < 5
    assert len(recs) == 3 and all(r.cut_at_window_end for r in recs)


def test_fixed_count_keeps_concurrency_and_counts_every_request():
    from speedmatrix import stats
    from speedmatrix.client import fixed_count

    async def go():
        async with TestServer(app()) as srv:
            url = str(srv.make_url("")).rstrip("/")
            return await fixed_count(url, "ok", lambda i: [1, 2, 3], requests=10, concurrency=3, max_tokens=8)
    wall, recs = asyncio.run(go())
    assert [r.index for r in recs] == list(range(10))
    assert {r.worker for r in recs} == {0, 1, 2}
    s = stats.fixed(recs, wall)
    assert s["completed"] == 10 and s["total_output_tokens"] == 80
    assert s["output_throughput"] == 80 / wall
    assert 2.0 <= s["avg_active_requests"] <= 3.0
    assert s["p95_ttft_ms"] >= s["median_ttft_ms"] > 0
