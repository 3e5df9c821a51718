"""Figures of a cell, derived from the raw per-request records.

Key names follow ``vllm bench serve`` where the quantity is the same
(``completed``, ``total_output_tokens``, ``output_throughput``,
``median_ttft_ms``, ``p99_itl_ms``...), so tooling that reads those reads ours.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np

from .client import RequestRecord


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def _dist(prefix: str, values_s: list[float]) -> dict[str, float | None]:
    return {
        f"mean_{prefix}_ms": _ms(float(np.mean(values_s))) if values_s else None,
        f"median_{prefix}_ms": _ms(_pct(values_s, 50)),
        f"p90_{prefix}_ms": _ms(_pct(values_s, 90)),
        f"p95_{prefix}_ms": _ms(_pct(values_s, 95)),
        f"p99_{prefix}_ms": _ms(_pct(values_s, 99)),
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


def request_rate(rec: RequestRecord) -> float | None:
    """A request's own decode speed: tokens after the first over the time they took."""
    if len(rec.chunk_times) < 2:
        return None
    span = rec.chunk_times[-1] - rec.chunk_times[0]
    return (rec.output_tokens - rec.chunk_tokens[0]) / span if span > 0 else None


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


def decode(records: list[RequestRecord], duration_s: float) -> dict[str, Any]:
    """Sustained decode over the window [0, duration_s] (seconds since t0)."""
    window_tokens = sum(n for r in records for t, n in zip(r.chunk_times, r.chunk_tokens) if t <= duration_s)
    completed = [r for r in records if r.finish_reason and not r.error and (r.end or 0) <= duration_s + 1e-6]
    failed = [r for r in records if r.error]
    ttfts = [r.first_token - r.start for r in records if r.first_token is not None]
    gaps = [g for r in records for g in token_gaps(r)]
    cgaps = [g for r in records for g in chunk_gaps(r)]
    rates = [x for x in (request_rate(r) for r in records) if x is not None]
    itl = _dist("itl", cgaps)
    out = {
        "duration": duration_s,
        "measured_s": duration_s,
        "num_requests": len(records),
        "completed": len(completed),
        "failed": len(failed),
        "errors_by_kind": errors_by_kind(records),
        "total_output_tokens": int(window_tokens),
        "output_throughput": window_tokens / duration_s if duration_s > 0 else None,
        "per_request_tok_s": float(np.mean(rates)) if rates else None,
        "avg_active_requests": active_integral(records, duration_s) / duration_s if duration_s > 0 else None,
        **_dist("ttft", ttfts),
        # time between tokens, per token (a multi-token chunk shares its gap)
        **{k.replace("itl", "tbt"): v for k, v in _dist("itl", gaps).items()},
        # vLLM's ITL: the gap between streamed chunks
        **itl,
    }
    return out


def fixed(records: list[RequestRecord], wall_s: float) -> dict[str, Any]:
    """A fixed set of requests (capacity and latency cells): everything over the wall time it took."""
    ok = [r for r in records if not r.error]
    tokens = sum(r.output_tokens for r in ok)
    ttfts = [r.first_token - r.start for r in ok if r.first_token is not None]
    rates = [x for x in (request_rate(r) for r in ok) if x is not None]
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
        **{k.replace("itl", "tbt"): v for k, v in _dist("itl", [g for r in ok for g in token_gaps(r)]).items()},
        **_dist("itl", [g for r in ok for g in chunk_gaps(r)]),
    }


def prefill(records: list[RequestRecord], context_tokens: int) -> dict[str, Any]:
    ok = [r for r in records if r.first_token is not None and not r.error]
    ttfts = [r.first_token - r.start for r in ok]
    med = _pct(ttfts, 50)
    return {
        "num_requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "total_input_tokens": context_tokens * len(ok),
        **_dist("ttft", ttfts),
        "prompt_tok_s": context_tokens / med if med else None,
    }
