"""NVIDIA's AIPerf (`aiperf profile`), synthetic prompts, against /v1/completions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core import atomic
from .base import Load, Peer


class AIPerf(Peer):
    name = "aiperf"
    module = "aiperf"
    pin = "aiperf==0.13.0"
    arrivals = ("poisson", "gamma")  # --request-rate, --arrival-pattern poisson or gamma (--arrival-smoothness)
    notes = ("synthetic prompts of the asked token count; sends no temperature unless told, so it is given "
             "temperature 0, ignore_eos and skip_special_tokens false as extra inputs; its first token is the "
             "first event with text (a request whose events all have empty text counts as failed); by default it "
             "counts output tokens by re-tokenizing the streamed text (more tokens than the server generated), so "
             "it runs with --use-server-token-count; its inter-token latency is per request ((end - first token) / "
             "(tokens - 1)), our TPOT")

    def argv(self, python: list[str], load: Load, work: Path, api_key: str | None) -> list[str]:
        # no environment variable or file takes AIPerf's key: it is on its command line (never logged here)
        # one argument, `--api-key=KEY`: a key may start with "-" (a generated one does, one time in 64), which
        # AIPerf's parser would take for an option and fail ("--api-key requires an argument")
        key = [f"--api-key={api_key}"] if api_key else []
        return [*python, "-m", "aiperf", "profile", "--model", load.model, "--tokenizer", load.tokenizer,
                "--endpoint-type", "completions", "--streaming", "--url", load.url,
                "--synthetic-input-tokens-mean", str(load.context), "--synthetic-input-tokens-stddev", "0",
                "--output-tokens-mean", str(load.max_tokens), "--output-tokens-stddev", "0",
                *[a for k, v in load.body.items() for a in ("--extra-inputs", f"{k}:{json.dumps(v)}")],
                "--use-server-token-count", *self._load_args(load),
                "--request-count", str(load.requests), "--random-seed", str(load.seed),
                "--output-artifact-dir", str(work / "artifacts"), "--ui-type", "none", *key]

    @staticmethod
    def _load_args(load: Load) -> list[str]:
        if not load.rate:
            return ["--concurrency", str(load.concurrency)]
        if load.burstiness == 1:
            return ["--request-rate", str(load.rate), "--arrival-pattern", "poisson"]
        return ["--request-rate", str(load.rate), "--arrival-pattern", "gamma",
                "--arrival-smoothness", str(load.burstiness)]

    def env(self, environ: dict[str, str], load: Load, api_key: str | None) -> dict[str, str]:
        # AIPerf 0.13.0 in offline mode (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set) looks every tokenizer up
        # in the hub cache, a local folder too, and fails ("Repo id must be in the form 'repo_name'"): so it
        # failed on the H200, where the workflow runs offline. A local folder needs no hub: those variables
        # are dropped for it (checked here: the online path loads a folder without a network)
        if Path(load.tokenizer).is_dir():
            return {k: v for k, v in environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        return dict(environ)

    def parse(self, work: Path) -> dict[str, Any]:
        d = atomic.read_json(next((work / "artifacts").rglob("profile_export_aiperf.json")))

        def stat(key: str, which: str) -> float | None:
            v = d.get(key)
            return None if not isinstance(v, dict) else v.get(which)

        return {"completed": stat("request_count", "avg"),
                "total_output_tokens": stat("total_output_tokens", "avg"),
                "output_throughput": stat("output_token_throughput", "avg"),
                "median_ttft_ms": stat("time_to_first_token", "p50"),
                "mean_ttft_ms": stat("time_to_first_token", "avg"),
                "median_tpot_ms": stat("inter_token_latency", "p50"),
                "duration": stat("benchmark_duration", "avg")}
