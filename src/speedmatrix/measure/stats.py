"""Figures of a cell, derived from the raw per-request records.

Key names follow ``vllm bench serve`` where the quantity is the same
(``completed``, ``total_output_tokens``, ``output_throughput``,
``median_ttft_ms``, ``p99_itl_ms``...), so tooling that reads those reads ours.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.status import Status

if TYPE_CHECKING:  # types only: reading a table's percentiles needs no client
    from .client import RequestRecord


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation between the two nearest values (numpy's default, as
    ``vllm bench serve`` computes its ``p99_ttft_ms``): every ``median_*``/``pNN_*`` figure of a cell."""
    return float(np.percentile(values, q)) if len(values) else None


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile by nearest rank, with no interpolation (MLPerf's reading, the one a latency target
    is judged by: an infinitely late request stays infinitely late)."""
    return float(np.percentile(values, q, method="inverted_cdf")) if len(values) else None



def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def _dist(prefix: str, values_s: list[float]) -> dict[str, float | None]:
    return {
        f"mean_{prefix}_ms": _ms(float(np.mean(values_s))) if values_s else None,
        f"median_{prefix}_ms": _ms(percentile(values_s, 50)),
        f"p90_{prefix}_ms": _ms(percentile(values_s, 90)),
        f"p95_{prefix}_ms": _ms(percentile(values_s, 95)),
        f"p99_{prefix}_ms": _ms(percentile(values_s, 99)),
    }


def token_gaps(rec: RequestRecord) -> list[float]:
    """Time between tokens: each chunk's gap shared by the tokens it carried."""
    gaps = []
    for k in range(1, len(rec.chunk_times)):
        gap = rec.chunk_times[k] - rec.chunk_times[k - 1]
        n = rec.chunk_tokens[k]
        if n > 0:
            gaps += [gap / n] * n
    return gaps


def chunk_gaps(rec: RequestRecord) -> list[float]:
    return [rec.chunk_times[k] - rec.chunk_times[k - 1] for k in range(1, len(rec.chunk_times))]


def tpot_ms(start_s: Any, end_s: Any, ttft_ms: Any, output_tokens: Any) -> np.ndarray:
    """TPOT, vLLM's time per output token: (end - first token) / (tokens - 1), for a request of two tokens or more
    (NaN otherwise); the first token came at start + TTFT, the end is its last token's (a finished request's
    ``end_s``). Numbers, arrays or table columns alike: the one
    definition a cell's figures, the latency targets and the regression verdict read."""
    tokens = np.asarray(output_tokens, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = ((np.asarray(end_s, dtype=float) - np.asarray(start_s, dtype=float)) * 1000.0
             - np.asarray(ttft_ms, dtype=float)) / (tokens - 1)
    return np.where(tokens >= 2, t, np.nan)


def request_tok_s(start_s: Any, end_s: Any, ttft_ms: Any, output_tokens: Any) -> np.ndarray:
    """A request's output tok/s: its tokens after the first over the time from its first token to its end (1000 /
    TPOT); NaN where that time is nothing (a request whose tokens all came at once has no rate of its own)."""
    t = tpot_ms(start_s, end_s, ttft_ms, output_tokens)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(t > 0, 1000.0 / t, np.nan)


def served_tok_s(start_s: Any, end_s: Any, output_tokens: Any) -> np.ndarray:
    """A request's output tok/s as its user saw it: its tokens over its whole time, the wait for the first token
    included (at a fixed number of requests in flight, their mean moves as the cell's output tok/s does, and a
    request whose tokens came in one burst still has one)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.asarray(end_s, dtype=float) - np.asarray(start_s, dtype=float)
        return np.where(d > 0, np.asarray(output_tokens, dtype=float) / d, np.nan)


def _of_records(fn, records: Iterable[RequestRecord]) -> list[float]:
    """``fn`` (:func:`tpot_ms` or :func:`request_tok_s`) over the records that have a first token, each ending at
    its last token (a request cut at a window's end stopped getting tokens before it was cut)."""
    ok = [r for r in records if r.ttft_s is not None and (r.chunk_times or r.end is not None)]
    values = fn([r.start for r in ok], [r.chunk_times[-1] if r.chunk_times else r.end for r in ok],
                [r.ttft_s * 1000.0 for r in ok], [r.output_tokens for r in ok]) if ok else []
    return [float(v) for v in values if not np.isnan(v)]


def request_rate(rec: RequestRecord) -> float | None:
    """One request's output tok/s (:func:`request_tok_s`), or None where it has none."""
    got = _of_records(request_tok_s, [rec])
    return got[0] if got else None


def active_integral(records: Iterable[RequestRecord], window_end: float) -> float:
    total = 0.0
    for r in records:
        end = min(r.end if r.end is not None else window_end, window_end)
        total += max(0.0, end - r.start)
    return total


def errors_by_kind(records: Iterable[RequestRecord]) -> dict[str, int]:
    """Failed requests counted by the kind of their error (the text before the first colon)."""
    kinds = Counter(r.error.split(":")[0] for r in records if r.error)
    return dict(kinds)


# An event that comes within this long of the one before it, in the same stream, came in a burst.
BURST_GAP_S = 0.001
# A cell whose streams came almost all in bursts was delivered in batches: its TTFT and time between
# tokens describe the delivery, not the generation (docs/fidelity.md). Well above the share a server
# that streams gives (on the CPU default up to ~0.5: the API server sometimes sends two tokens at
# once; speculative decoding sends the tokens of a step together), well below the ~1.0 of whole
# responses arriving at once.
BATCHED_SHARE = 0.8
# At this share the median gap between events is a gap inside a burst (the median of the gaps is below
# BURST_GAP_S exactly when at least half of them are): below what the client resolves, so the median time
# between tokens is no figure (the report prints n/m) while the first event still marks the first token.
# Not a tuned line: it follows from what a median is.
MEDIAN_IN_BURST_SHARE = 0.5


def delivery_kind(share: float | None) -> str | None:
    """``batched`` (whole bursts: TTFT and time between tokens describe the delivery), ``bursts`` (the median
    gap between events lies inside a burst: no median time between tokens) or ``streamed``."""
    if share is None:
        return None
    return "batched" if share >= BATCHED_SHARE else "bursts" if share >= MEDIAN_IN_BURST_SHARE else "streamed"


def delivery(records: Iterable[RequestRecord]) -> dict[str, Any]:
    """How the streams came: the share of events within BURST_GAP_S of the one before (after the first)."""
    gaps = [g for r in records if not r.error for g in chunk_gaps(r)]
    if not gaps:
        return {"delivery": None, "delivery_burst_share": None}
    share = sum(1 for g in gaps if g < BURST_GAP_S) / len(gaps)
    return {"delivery": delivery_kind(share), "delivery_burst_share": share}


def cached_share(records: Iterable[RequestRecord]) -> float | None:
    """The share of the prompt tokens the server served from its prefix cache, from its own per-request report
    (``cached_tokens``; None where it gives none: vLLM without --enable-prompt-tokens-details)."""
    pairs = [(r.cached_tokens, r.server_prompt_tokens or r.prompt_tokens) for r in records
             if not r.error and r.cached_tokens is not None]
    total = sum(n for _, n in pairs)
    return sum(c for c, _ in pairs) / total if total else None


def steady_start(records: list[RequestRecord], concurrency: int) -> float | None:
    """When every one of the first ``concurrency`` requests had its first token: from then on the target
    number of requests is decoding (each finished one is replaced at once). None if one never had it."""
    first = sorted(records, key=lambda r: r.start)[:concurrency]
    if len(first) < concurrency or any(r.first_token is None for r in first):
        return None
    return max(r.first_token for r in first)


def decode(records: list[RequestRecord], duration_s: float, concurrency: int | None = None) -> dict[str, Any]:
    """Sustained decode over the window [0, duration_s] (seconds since t0).

    ``output_throughput`` counts the steady part of the window only: from the moment the first
    ``concurrency`` requests all have their first token (the ramp-up, when requests are still in
    prefill, is left out) to the window's end; ``steady_fraction`` is its share of the window.
    ``output_throughput_window`` is the whole window's figure. Without a steady part both are the
    whole window's and ``steady_fraction`` is 0: no moment inside the window when the first requests all
    had a token, or no token after it while the window had some (a server that delivered each stream whole:
    the first token came with the rest, so nothing was left to arrive in the steady part)."""
    window_tokens = sum(n for r in records for t, n in zip(r.chunk_times, r.chunk_tokens) if t <= duration_s)
    t_s = steady_start(records, concurrency or 1)
    steady_s = duration_s - t_s if t_s is not None and t_s < duration_s else 0.0
    steady_tokens = sum(n for r in records for t, n in zip(r.chunk_times, r.chunk_tokens)
                        if t_s is not None and t_s < t <= duration_s)
    if steady_tokens == 0 and window_tokens > 0:
        steady_s = 0.0
    completed = [r for r in records if r.finish_reason and not r.error and (r.end or 0) <= duration_s + 1e-6]
    failed = [r for r in records if r.error]
    ttfts = [r.ttft_s for r in records if r.ttft_s is not None]
    gaps = [g for r in records for g in token_gaps(r)]
    cgaps = [g for r in records for g in chunk_gaps(r)]
    rates = _of_records(request_tok_s, records)
    itl = _dist("itl", cgaps)
    out = {
        "duration": duration_s,
        "measured_s": duration_s,
        "num_requests": len(records),
        "completed": len(completed),
        "failed": len(failed),
        "errors_by_kind": errors_by_kind(records),
        "total_output_tokens": int(window_tokens),
        "output_throughput": (steady_tokens / steady_s if steady_s > 0
                              else window_tokens / duration_s if duration_s > 0 else None),
        "output_throughput_window": window_tokens / duration_s if duration_s > 0 else None,
        "steady_s": steady_s,
        "steady_fraction": steady_s / duration_s if duration_s > 0 else None,
        "per_request_tok_s": float(np.mean(rates)) if rates else None,
        "avg_active_requests": active_integral(records, duration_s) / duration_s if duration_s > 0 else None,
        **_dist("ttft", ttfts),
        # time between tokens, per token (a multi-token chunk shares its gap)
        **{k.replace("itl", "tbt"): v for k, v in _dist("itl", gaps).items()},
        # vLLM's ITL: the gap between streamed chunks
        **itl,
        **delivery(records),
    }
    return out


def fixed(records: list[RequestRecord], wall_s: float) -> dict[str, Any]:
    """A fixed set of requests (capacity and latency cells): everything over the wall time it took."""
    ok = [r for r in records if not r.error]
    tokens = sum(r.output_tokens for r in ok)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    rates = _of_records(request_tok_s, ok)
    # TPOT per request (vLLM's; AIPerf's and GuideLLM's "ITL"), in seconds as every distribution here
    tpots = [v / 1000.0 for v in _of_records(tpot_ms, ok)]
    return {
        "duration": wall_s,
        "measured_s": wall_s,
        "num_requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "errors_by_kind": errors_by_kind(records),
        "total_input_tokens": sum(r.prompt_tokens for r in ok),
        "total_output_tokens": tokens,
        "request_throughput": len(ok) / wall_s if wall_s > 0 else None,
        "output_throughput": tokens / wall_s if wall_s > 0 else None,
        "per_request_tok_s": float(np.mean(rates)) if rates else None,
        "avg_active_requests": active_integral(records, wall_s) / wall_s if wall_s > 0 else None,
        **_dist("ttft", ttfts),
        **_dist("tpot", tpots),
        **{k.replace("itl", "tbt"): v for k, v in _dist("itl", [g for r in ok for g in token_gaps(r)]).items()},
        **_dist("itl", [g for r in ok for g in chunk_gaps(r)]),
        **delivery(ok),
    }


def prefill(records: list[RequestRecord], context_tokens: int) -> dict[str, Any]:
    ok = [r for r in records if r.first_token is not None and not r.error]
    ttfts = [r.ttft_s for r in ok]
    med = percentile(ttfts, 50)
    return {
        "num_requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "total_input_tokens": context_tokens * len(ok),
        **_dist("ttft", ttfts),
        "prompt_tok_s": context_tokens / med if med else None,
    }


# ---- repeats -----------------------------------------------------------------

# two-sided 95 % critical values of Student's t by degrees of freedom (1-30); above 30, 1.96
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042]

# the figures a cell's repeats give an interval and a coefficient of variation for
SPREAD_FIGURES = ("output_throughput", "prompt_tok_s", "per_request_tok_s", "median_ttft_ms", "median_tbt_ms",
                  "median_itl_ms")
# counts over the whole cell: summed over its repeats (every other figure: the median of the repeats)
ADDITIVE = ("num_requests", "completed", "failed", "total_output_tokens", "total_input_tokens", "prompts_built",
            "measured_s", "duration", "steady_s")


def interval(values: list[float]) -> dict[str, Any]:
    """The mean's 95 % confidence interval by Student's t, and the coefficient of variation (sd / mean),
    over a cell's repeats; None with fewer than two. Every figure here is a rate or a time, never
    negative: the interval's low end is clipped at 0 (with two repeats t is 12.7 and it can reach below)."""
    v = [float(x) for x in values if x is not None]
    if len(v) < 2:
        return {"ci95": None, "cv": None}
    mean, sd = float(np.mean(v)), float(np.std(v, ddof=1))
    half = (_T95[len(v) - 2] if len(v) - 1 <= len(_T95) else 1.96) * sd / len(v) ** 0.5
    return {"ci95": [max(0.0, mean - half), mean + half], "cv": sd / mean if mean else None}


def combine(repeats: list[dict[str, Any]], worst: Iterable[str] = ()) -> dict[str, Any]:
    """A cell's figures over its repeats: counts summed, the figures named in ``worst`` the worst (the client
    check's), every other number the median of the repeats, a repeat's own verdict (status) the cell's, and for
    each of SPREAD_FIGURES its interval (``<figure>_ci95``) and CV (``<figure>_cv``)."""
    if len(repeats) == 1:
        return dict(repeats[0])
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for r in repeats for k in r):
        values = [r.get(key) for r in repeats]
        nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if key == "errors_by_kind":
            merged: Counter = Counter()
            for v in values:
                merged.update(v or {})
            out[key] = dict(merged)
        elif key in ADDITIVE and nums:
            out[key] = sum(nums)
        elif key in worst and nums:
            out[key] = max(nums)
        elif nums and len(nums) == len([v for v in values if v is not None]):
            out[key] = float(np.median(nums))
        else:
            out[key] = values[-1]
    # a repeat's verdict on its own measurement (client-bound: why) is the cell's
    judged = next((r for r in repeats if r.get("status") not in (None, Status.VALID)), None)
    if judged is not None:
        out["status"], out["status_reason"] = judged["status"], judged.get("status_reason")
    if out.get("delivery_burst_share") is not None:
        out["delivery"] = delivery_kind(out["delivery_burst_share"])
    for key in SPREAD_FIGURES:
        if any(r.get(key) is not None for r in repeats):
            spread = interval([r.get(key) for r in repeats])
            out[f"{key}_ci95"], out[f"{key}_cv"] = spread["ci95"], spread["cv"]
    return out
