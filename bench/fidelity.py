#!/usr/bin/env python3
"""Fidelity of the speedmatrix client against the server's counters and against `vllm bench serve`.

    .venv/bin/python bench/fidelity.py [--rounds 3] [--out bench/results/fidelity.json]

Starts the embedded default server (experiment tiny-cpu, config ``base``:
real vLLM on the CPU, the default's tiny Gemma-4 target) on a free port, then
for each shape (input tokens, output tokens, requests, concurrency) runs, in
one run and alternating, ``speedmatrix measure --workload capacity`` and
``vllm bench serve`` (random dataset) with the same input and output lengths,
request count and concurrency, ``ignore_eos`` on for both so that every
request produces exactly the output length. Each client runs as its own
process, one at a time. Around every run the server's
``vllm:generation_tokens_total`` is read, so each client's token count is
checked against the server's own.

Writes every run and a summary (median over rounds per client and shape, the
relative differences) to --out; docs/fidelity.md reports them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from speedmatrix import peers  # noqa: E402
from speedmatrix.measure import client, metrics  # noqa: E402
from speedmatrix.plan import experiment  # noqa: E402
from speedmatrix.serve import runtimes  # noqa: E402
from speedmatrix.serve.procs import end_group, free_port, group_members  # noqa: E402

# how close the two clients' medians must be, in percent, for them to agree
TARGETS_PCT = {"output_throughput": 5.0, "median_ttft_ms": 10.0}
# (input tokens, output tokens, requests, concurrency)
SHAPES = [(256, 128, 128, 8), (1024, 64, 24, 1), (128, 128, 256, 32)]


def scrape(url: str) -> float:
    """The server's generation-token counter, read as a cell reads it (``client.scrape``)."""
    async def read() -> dict:
        async with client.control_session(timeout_s=30) as session:
            return await client.scrape(session, url)

    return metrics.total(asyncio.run(read()), "vllm:generation_tokens_total")


def start_server(models_dir: str) -> tuple[subprocess.Popen, str, Path]:
    exp = experiment.load("tiny-cpu", REPO / "config/experiments")
    srv = exp.server("base")
    port = free_port("127.0.0.1")
    argv = runtimes.launch_argv(exp, srv, models_dir, port)
    log = Path(tempfile.mkstemp(prefix="fidelity-server-", suffix=".log")[1])
    env = {**os.environ, **srv.env}
    proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
                if resp.status == 200:
                    return proc, url, log
        except OSError:
            time.sleep(1)
    raise SystemExit(f"server not ready in 600 s; see {log}")


def place_processes(pgid: int, client_on: str = "worker") -> list[str]:
    """Fixed CPU placement for the run (2 cores: compute on one, everything else on the other).

    vLLM's CPU worker binds its threads to its cores (VLLM_CPU_OMP_THREADS_BIND); the API server
    and the EngineCore float, and on 2 cores where the OS puts them decides the figures (TTFT of
    30 ms or 1.5 s for the same cell). They are pinned to the cores the worker does not use; the
    clients run on the worker's cores. Returns the client's taskset prefix.
    """
    worker_cores: set[int] = set()
    others = []
    for pid in group_members(pgid):
        title = Path(f"/proc/{pid}/comm").read_text().strip()
        if title.startswith("VLLM::Worker"):
            worker_cores |= os.sched_getaffinity(pid)
        else:
            others.append(pid)
    rest = sorted(set(os.sched_getaffinity(0)) - worker_cores)
    if not worker_cores or not rest:
        return []
    for pid in others:
        subprocess.run(["taskset", "-a", "-p", "-c", ",".join(map(str, rest)), str(pid)], check=True,
                       capture_output=True)
    client_cores = sorted(worker_cores) if client_on == "worker" else rest
    return ["taskset", "-c", ",".join(map(str, client_cores))]


def run_ours(url: str, shape: tuple[int, int, int, int], out: Path, prefix: list[str]) -> dict:
    inp, outp, n, c = shape
    cmd = [*prefix, str(REPO / ".venv/bin/speedmatrix"), "measure", "--url", url, "--model", "tiny",
           "--workload", "capacity",
           "--context", str(inp), "--max-tokens", str(outp), "--requests", str(n), "--concurrency", str(c),
           "--ignore-eos", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    r = json.loads(out.read_text())  # vllm bench serve's keys at the top level
    return {k: r.get(k) for k in ("completed", "total_output_tokens", "output_throughput", "median_ttft_ms",
                                  "mean_ttft_ms", "median_itl_ms", "total_input_tokens", "duration")}


def run_vllm(url: str, shape: tuple[int, int, int, int], out: Path, tokenizer: str, prefix: list[str]) -> dict:
    inp, outp, n, c = shape
    load = peers.Load(url=url, model="tiny", tokenizer=tokenizer, context=inp, max_tokens=outp, requests=n,
                      concurrency=c, seed=int(time.time()))
    return peers.run(peers.table()["vllm_bench_serve"], load, [*prefix, sys.executable], out.with_suffix(""))


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _terminate(*_: object) -> None:
    """SIGTERM: end through the cleanup, once (a second SIGTERM must not interrupt it)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(143)


def summarize(runs: list[dict], shapes: list[tuple[int, int, int, int]]) -> list[dict]:
    """Per shape and client: the median over rounds of output tok/s and median TTFT, each with its range over the
    rounds, whether every round's token count was the server's; and the relative differences of the medians."""
    summary = []
    for shape in shapes:
        key = dict(zip(("input", "output", "requests", "concurrency"), shape))
        med = {}
        for who in ("speedmatrix", "vllm_bench_serve"):
            rows = [r for r in runs if r["client"] == who and r["shape"] == key]
            med[who] = {}
            for m in ("output_throughput", "median_ttft_ms"):
                values = [r[m] for r in rows]
                med[who][m] = statistics.median(values)
                med[who][f"{m}_range"] = [min(values), max(values)]
            med[who]["token_counts_equal_server"] = all(r["total_output_tokens"] == r["server_generation_tokens"]
                                                        for r in rows)
        ours, theirs = med["speedmatrix"], med["vllm_bench_serve"]
        diff = {f"{m}_diff_pct": 100 * (ours[m] / theirs[m] - 1) for m in TARGETS_PCT}
        summary.append({"shape": key, "speedmatrix": ours, "vllm_bench_serve": theirs, **diff,
                        "targets_pct": TARGETS_PCT,
                        "within_targets": all(abs(diff[f"{m}_diff_pct"]) <= TARGETS_PCT[m] for m in TARGETS_PCT)})
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="alternations per shape (each: ours, then vLLM's)")
    ap.add_argument("--models-dir", default=str(REPO / "resources/models"))
    ap.add_argument("--client-cores", choices=["worker", "other"], default="worker",
                    help="run the clients on the vLLM worker's cores or on the others (with the API server)")
    ap.add_argument("--shapes", default="all", help="indices into SHAPES, e.g. 1 or 0,2")
    ap.add_argument("--out", default=str(REPO / "bench/results/fidelity.json"))
    ap.add_argument("--summarize", action="store_true",
                    help="measure nothing: write --out's summary again from the runs it holds")
    ns = ap.parse_args()
    if ns.summarize:
        doc = json.loads(Path(ns.out).read_text())
        shapes = [tuple(s["shape"][k] for k in ("input", "output", "requests", "concurrency")) for s in doc["summary"]]
        doc["summary"] = summarize(doc["runs"], shapes)
        Path(ns.out).write_text(json.dumps(doc, indent=1) + "\n")
        return 0
    model_dir = Path(ns.models_dir) / experiment.load("tiny-cpu", REPO / "config/experiments").server("base").model
    if not (model_dir / "config.json").exists():
        raise SystemExit(f"no {model_dir.name} under {ns.models_dir}: run `make run` (or the model rule) first")
    # SIGTERM ends the run through the finally below, so the server never outlives it
    signal.signal(signal.SIGTERM, _terminate)
    shapes = SHAPES if ns.shapes == "all" else [SHAPES[int(i)] for i in ns.shapes.split(",")]
    proc, url, log = start_server(ns.models_dir)
    prefix = place_processes(proc.pid, ns.client_cores)
    print(f"client placement: {prefix or 'floating'}", flush=True)
    runs = []
    scratch = Path(tempfile.mkdtemp(prefix="fidelity-"))
    try:
        for shape in shapes:
            for rnd in range(ns.rounds):
                order = ("speedmatrix", "vllm_bench_serve") if rnd % 2 == 0 else ("vllm_bench_serve", "speedmatrix")
                for who in order:
                    out = scratch / f"{who}-{'-'.join(map(str, shape))}-{rnd}.json"
                    before = scrape(url)
                    res = (run_ours(url, shape, out, prefix) if who == "speedmatrix"
                           else run_vllm(url, shape, out, str(model_dir), prefix))
                    server_tokens = scrape(url) - before
                    row = {"client": who, "shape": dict(zip(("input", "output", "requests", "concurrency"), shape)),
                           "round": rnd, **res, "server_generation_tokens": server_tokens}
                    runs.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        end_group(proc.pid, grace_s=60)
    summary = summarize(runs, shapes)
    doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(), "cpus": os.cpu_count(),
           "server": f"tiny-cpu/base (vllm-cpu, {model_dir.name})", "cpu_model": cpu_model(), "rounds": ns.rounds,
           "client_placement": " ".join(prefix) or "floating",
           "summary": summary, "runs": runs}
    Path(ns.out).write_text(json.dumps(doc, indent=1) + "\n")
    for s in summary:
        print(json.dumps({k: s[k] for k in ("shape", "output_throughput_diff_pct", "median_ttft_diff_pct")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
