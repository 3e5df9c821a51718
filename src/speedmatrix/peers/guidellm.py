"""GuideLLM (`guidellm run`, Red Hat / vLLM project), synthetic prompts, against /v1/completions.

The run is described by a scenario file (the format of GuideLLM's own built-in
scenarios), so that nested settings (the request body's temperature) need no
command-line syntax of their own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core import atomic
from .base import Load, Peer


class GuideLLM(Peer):
    name = "guidellm"
    module = "guidellm"
    pin = "guidellm==0.8.1"
    arrivals = ("poisson",)  # a poisson profile at the rate; it draws no gamma gaps
    notes = ("synthetic prompts of the asked token count; sends no temperature unless told (given temperature 0 "
             "and skip_special_tokens false in the body); its first token is the first event with text; asks the "
             "server for usage on every chunk (continuous_usage_stats) and counts tokens from it; its output tok/s "
             "here is its total output tokens over its benchmark's duration; its inter-token latency is per "
             "request, our TPOT; its median is the lower of the two middle values (the smallest value with half "
             "the requests at or below it), ours their mean: where requests' first tokens come in prefill waves "
             "(many at once) the two middle ones can fall in different waves and the medians then differ by up "
             "to half the gap between waves")

    def argv(self, python: list[str], load: Load, work: Path, api_key: str | None) -> list[str]:
        if load.rate and load.burstiness != 1:
            raise ValueError("GuideLLM draws Poisson arrivals only (burstiness 1)")
        scenario = {"spec": {
            "backend": {"kind": "openai_http", "target": load.url, "model": load.model,
                        "request_format": "/v1/completions", "extras": {"body": load.body}},
            "profile": ({"kind": "poisson", "rate": load.rate} if load.rate
                        else {"kind": "concurrent", "streams": load.concurrency}),
            "data": [{"kind": "synthetic_text", "prompt_tokens": load.context, "output_tokens": load.max_tokens}],
            "tokenizer": {"kind": "huggingface_auto", "model": load.tokenizer},
            "constraints": [{"kind": "max_requests", "count": load.requests}],
            "seed": {"kind": "static", "value": load.seed},
            "outputs": [{"kind": "json", "path": str(work / "guidellm.json")}]}}
        if api_key:  # GuideLLM reads the key from its scenario only: a private file, removed after the run
            scenario["spec"]["backend"]["api_key"] = api_key
        path = work / "scenario.json"
        path.touch(mode=0o600)
        path.write_text(json.dumps(scenario, indent=1))
        return [*python, "-m", "guidellm", "run", "--scenario", str(path), "--disable-progress"]

    def parse(self, work: Path) -> dict[str, Any]:
        b = atomic.read_json(work / "guidellm.json")["benchmarks"][0]
        m = b["metrics"]

        def ok(key: str, which: str) -> float | None:
            # a distribution of no values (no request had a first token: every event's text was empty) reads
            # 0.0 in GuideLLM's file: no figure, not zero
            v = (m.get(key) or {}).get("successful") or {}
            return v.get(which) if v.get("count") else None

        tokens = ok("output_token_count", "total_sum")
        duration = b.get("duration")
        return {"completed": m["request_totals"]["successful"], "total_output_tokens": tokens,
                "output_throughput": tokens / duration if tokens and duration else None,
                "median_ttft_ms": ok("time_to_first_token_ms", "median"),
                "mean_ttft_ms": ok("time_to_first_token_ms", "mean"),
                "median_tpot_ms": ok("inter_token_latency_ms", "median"), "duration": duration}
