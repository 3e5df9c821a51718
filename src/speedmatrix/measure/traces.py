"""Production traces: when each request came and how long it was, replayed on their own schedule.

A trace is a dataset of the experiment (``datasets:``, pinned in ``datasets.lock`` like any other) in one of the
formats of :data:`FORMATS`, each a loader from the file's rows to :class:`TraceRequest` s:

- ``mooncake`` (Mooncake's published traces, JSONL): ``timestamp`` (ms from the trace's start),
  ``input_length``, ``output_length`` and ``hash_ids``: one id per 512-token block of the prompt, the same id
  where two requests share that block and every block before it (a prefix);
- ``azure`` (Azure LLM inference traces, CSV): ``TIMESTAMP`` (a date and time), ``ContextTokens``,
  ``GeneratedTokens``; no sharing is recorded, so every prompt is its own.

**Prompts with the trace's sharing.** Each hash id becomes one block of tokens cut from the corpus by a seeded
draw on the id (and the cell's salt, so no earlier run's cache matches): requests that share a hash id share
exactly those tokens, at the same place; the part of a prompt past its hash ids is its own. ``token_scale``
scales every length (the block too: 512 x scale tokens, a whole number) so a trace written for a large model
fits a small one with its structure kept; prompts still longer than the cell's context are skipped and counted.

**Theoretical prefix hits** (:func:`prefix_hits`): the requests in arrival order against an LRU cache of the
server's KV size in blocks; a request hits the longest run of its leading blocks still cached (a prefix cache
matches from the start and stops at the first miss), and its blocks then enter the cache. This is the ideal the
server's measured hit rate is set against: the server caches in its own block size, cannot reuse a block still
being computed by a request beside it, and recomputes a prompt's last token.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..core.errors import TraceError

MOONCAKE_BLOCK = 512  # tokens per hash id in Mooncake's traces


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace, as the trace recorded it."""

    t_s: float  # seconds from the trace's first request
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()  # the prompt's shared blocks, in order (mooncake)


def _need(row: dict[str, Any], key: str, i: int, where: str) -> Any:
    if key not in row:
        raise TraceError(f"{where}: row {i} has no {key!r} (it has {', '.join(map(str, list(row)[:8]))})")
    return row[key]


def mooncake(rows: Iterable[dict[str, Any]], spec: dict[str, Any]) -> list[TraceRequest]:
    where = spec.get("_where", "trace")
    out = [TraceRequest(float(_need(r, "timestamp", i, where)) / 1000.0, int(_need(r, "input_length", i, where)),
                        int(_need(r, "output_length", i, where)), tuple(int(h) for h in r.get("hash_ids") or ()))
           for i, r in enumerate(rows)]
    return _from_zero(out)


def azure(rows: Iterable[dict[str, Any]], spec: dict[str, Any]) -> list[TraceRequest]:
    import pandas as pd

    where = spec.get("_where", "trace")
    rows = list(rows)
    try:
        stamps = pd.to_datetime([str(_need(r, "TIMESTAMP", i, where)) for i, r in enumerate(rows)])
    except (ValueError, TypeError) as exc:
        raise TraceError(f"{where}: TIMESTAMP is not a date and time: {exc}") from None
    t0 = stamps.min() if len(stamps) else None
    return sorted((TraceRequest((s - t0).total_seconds(), int(_need(r, "ContextTokens", i, where)),
                                int(_need(r, "GeneratedTokens", i, where)))
                   for i, (r, s) in enumerate(zip(rows, stamps))), key=lambda q: q.t_s)


def _from_zero(reqs: list[TraceRequest]) -> list[TraceRequest]:
    reqs = sorted(reqs, key=lambda q: q.t_s)
    t0 = reqs[0].t_s if reqs else 0.0
    return [TraceRequest(q.t_s - t0, q.input_tokens, q.output_tokens, q.hash_ids) for q in reqs]


# format -> its loader (rows, the dataset's spec) -> the trace's requests in time order
FORMATS: dict[str, Callable[[Iterable[dict[str, Any]], dict[str, Any]], list[TraceRequest]]] = {
    "mooncake": mooncake, "azure": azure,
}


def summary(reqs: list[TraceRequest]) -> dict[str, Any]:
    """What the lock records of a trace beside its hash."""
    return {"records": len(reqs), "span_s": round(reqs[-1].t_s, 3) if reqs else 0.0,
            "shared_blocks": bool(any(q.hash_ids for q in reqs))}


def window(reqs: list[TraceRequest], start_s: float = 0.0, duration_s: float | None = None, sample: float = 1.0,
           seed: int = 0) -> list[TraceRequest]:
    """The requests in ``[start_s, start_s + duration_s)`` of the trace's time (every one after ``start_s`` without
    a duration), each kept with probability ``sample`` (seeded), times from the window's start."""
    end = float("inf") if duration_s is None else start_s + duration_s
    rng = random.Random(f"{seed}/trace-sample")
    kept = [q for q in reqs if start_s <= q.t_s < end and (sample >= 1 or rng.random() < sample)]
    return [TraceRequest(q.t_s - start_s, q.input_tokens, q.output_tokens, q.hash_ids) for q in kept]


def scaled(q: TraceRequest, token_scale: float) -> tuple[int, int]:
    """The request's (input, output) tokens at the scale (each at least one)."""
    return max(1, round(q.input_tokens * token_scale)), max(1, round(q.output_tokens * token_scale))


def block_tokens(token_scale: float) -> int:
    """Tokens per hash id at the scale; a whole number, or the scale is refused."""
    b = MOONCAKE_BLOCK * token_scale
    if b < 1 or abs(b - round(b)) > 1e-9:
        raise TraceError(f"token_scale {token_scale:g} makes a {MOONCAKE_BLOCK}-token block {b:g} tokens: choose a "
                         f"scale that gives a whole number (e.g. 0.25: 128 tokens)")
    return round(b)


def prompt_ids(q: TraceRequest, index: int, token_scale: float, corpus_ids: list[int], salt: str) -> list[int]:
    """The request's prompt: its hash ids' blocks (the same tokens for the same id), then tokens of its own, cut to
    its scaled input length."""
    n, _ = scaled(q, token_scale)
    out: list[int] = []
    if q.hash_ids:
        size = block_tokens(token_scale)
        for h in q.hash_ids:
            if len(out) >= n:
                break
            out += _window(corpus_ids, random.Random(f"{salt}/block/{h}"), size)
    if len(out) < n:
        out += _window(corpus_ids, random.Random(f"{salt}/own/{index}"), n - len(out))
    return out[:n]


def _window(ids: list[int], rng: random.Random, n: int) -> list[int]:
    start = rng.randrange(len(ids))
    return [ids[(start + k) % len(ids)] for k in range(n)]


def prefix_hits(reqs: list[TraceRequest], token_scale: float, capacity_tokens: int | None) -> dict[str, Any]:
    """The trace's theoretical prefix-cache hit rate (tokens served from cache over prompt tokens) in arrival order,
    with an LRU cache of ``capacity_tokens`` (None: unbounded); only whole blocks count."""
    if not any(q.hash_ids for q in reqs):
        return {"hit_rate": 0.0, "hit_tokens": 0, "prompt_tokens": sum(scaled(q, token_scale)[0] for q in reqs)}
    size = block_tokens(token_scale)
    capacity = None if capacity_tokens is None else max(0, capacity_tokens // size)
    cache: OrderedDict[int, None] = OrderedDict()
    hit = total = 0
    for q in reqs:
        n, _ = scaled(q, token_scale)
        blocks = list(q.hash_ids[: n // size])  # whole blocks of this prompt
        total += n
        for h in blocks:  # the leading run still cached
            if h not in cache:
                break
            hit += size
        for h in blocks:
            cache[h] = None
            cache.move_to_end(h)
        while capacity is not None and len(cache) > capacity:
            cache.popitem(last=False)
    return {"hit_rate": hit / total if total else 0.0, "hit_tokens": hit, "prompt_tokens": total}
