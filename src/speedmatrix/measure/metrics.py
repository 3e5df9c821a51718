"""Server counters: scrape vLLM's Prometheus ``/metrics`` and take deltas around a cell.

The text is parsed with ``prometheus_client``'s parser. Against a server that
does not expose these metrics, every derived field is ``None`` (absent) and
the cell still runs.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, tuple[tuple[str, str], ...]]

COUNTERS = {
    "generation_tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "spec_drafts": "vllm:spec_decode_num_drafts_total",
    "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "preemptions": "vllm:num_preemptions_total",
    # every request the engine finished, whatever the reason (length, stop, abort, ...)
    "requests_finished": "vllm:request_success_total",
}
GAUGES = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
}


def parse(text: str) -> dict[Sample, float]:
    """Every sample of a Prometheus exposition, keyed by (name, sorted labels)."""
    out: dict[Sample, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def total(samples: dict[Sample, float], name: str) -> float | None:
    """Sum of a metric over all its label sets (e.g. every model name); None if absent."""
    vals = [v for (n, _), v in samples.items() if n == name]
    return sum(vals) if vals else None


def labels_of(samples: dict[Sample, float], name: str) -> dict[str, str] | None:
    for (n, labels), _ in samples.items():
        if n == name:
            return dict(labels)
    return None


def cache_info(samples: dict[Sample, float]) -> dict[str, Any]:
    """KV cache facts from ``vllm:cache_config_info`` (labels carry the values)."""
    labels = labels_of(samples, "vllm:cache_config_info") or {}

    def num(key: str, cast=int):
        try:
            return cast(float(labels[key]))
        except (KeyError, ValueError):
            return None

    return {
        "kv_cache_size_tokens": num("kv_cache_size_tokens"),
        "kv_cache_max_concurrency": num("kv_cache_max_concurrency", float),
        "block_size": num("block_size"),
        "num_gpu_blocks": num("num_gpu_blocks"),
        "enable_prefix_caching": labels.get("enable_prefix_caching"),
    }


def snapshot(samples: dict[Sample, float]) -> dict[str, float | None]:
    snap = {k: total(samples, n) for k, n in {**COUNTERS, **GAUGES}.items()}
    for (n, labels), v in samples.items():
        if n == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            snap[f"spec_accepted_pos_{dict(labels).get('position')}"] = snap.get(
                f"spec_accepted_pos_{dict(labels).get('position')}", 0.0
            ) + v
    return snap


# what delta() derives: the counter fields of a cell's result
DELTA_KEYS = ("server_generation_tokens", "server_prompt_tokens", "server_requests_finished", "preemptions",
              "spec_decode_acceptance_rate",
              "spec_decode_acceptance_length", "prefix_cache_hit_rate", "prefix_cache_queries", "prefix_cache_hits",
              "spec_decode_per_position_acceptance")


def delta(before: dict[str, float | None], after: dict[str, float | None]) -> dict[str, Any]:
    """Counter deltas over a cell and what vLLM's own bench derives from them."""
    d: dict[str, Any] = {}
    for k in set(before) | set(after):
        if k in GAUGES:
            continue
        a, b = after.get(k), before.get(k)
        d[k] = None if a is None or b is None else a - b
    drafts, draft_tok, acc = d.get("spec_drafts"), d.get("spec_draft_tokens"), d.get("spec_accepted_tokens")
    out: dict[str, Any] = {
        "server_generation_tokens": d.get("generation_tokens"),
        "server_prompt_tokens": d.get("prompt_tokens"),
        "server_requests_finished": d.get("requests_finished"),
        "preemptions": d.get("preemptions"),
        "spec_decode_acceptance_rate": (acc / draft_tok) if draft_tok else None,
        # mean tokens emitted per draft step: 1 (the verified token) + accepted drafts
        "spec_decode_acceptance_length": (1 + acc / drafts) if drafts else None,
        "prefix_cache_queries": d.get("prefix_cache_queries"),
        "prefix_cache_hits": d.get("prefix_cache_hits"),
        "prefix_cache_hit_rate": (
            d["prefix_cache_hits"] / d["prefix_cache_queries"] if d.get("prefix_cache_queries") else None
        ),
    }
    positions = sorted(
        (int(k.rsplit("_", 1)[1]), v) for k, v in d.items() if k.startswith("spec_accepted_pos_") and v is not None
    )
    out["spec_decode_per_position_acceptance"] = (
        [v / drafts for _, v in positions] if positions and drafts else None
    )
    return out


def in_flight(samples: dict[str, Any]) -> tuple[float, float] | None:
    """The server's requests running and waiting, or None where it has no such gauges."""
    running = total(samples, GAUGES["running"])
    waiting = total(samples, GAUGES["waiting"])
    return None if running is None or waiting is None else (running, waiting)
