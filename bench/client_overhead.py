#!/usr/bin/env python3
"""Client overhead: how many streamed tokens per second a benchmark client ingests on one core,
and how far its timings are from delays the server injects. speedmatrix's client against
`vllm bench serve`'s request function, on the same local streamer (tests/fast_streamer.py).

    .venv/bin/python bench/client_overhead.py [--out bench/results/client_overhead.json]

The streamer runs pinned to one core and the client under test to another
(``taskset``), one client process at a time, alternating the two clients.

* ingest: the streamer sends 2,048 one-token events per request as fast as it
  can; at concurrency 1 to 256 each client runs max(2 x concurrency, 48)
  requests; figure: output tokens / wall seconds (median of the rounds);
* timing: the streamer holds the first event 50 ms and then spaces events 5 ms
  apart on a fixed schedule; figure: the client's TTFT and inter-token gaps
  minus the injected values (median and p99 of the absolute error).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from speedmatrix.serve.procs import free_port  # noqa: E402

PROMPT = [1] * 16


async def _ours(url: str, concurrency: int, requests: int, tokens: int) -> tuple[float, list, list, int]:
    from speedmatrix.measure import client

    # per-event usage off: the same request vllm bench serve sends (the streamer then sends what vLLM would)
    opts = client.RequestOptions(max_tokens=tokens, ignore_eos=True, usage_per_chunk=False)
    wall, records = await client.fixed_count(url, "bench", lambda i: PROMPT, requests, concurrency, opts)
    ok = [r for r in records if not r.error]
    ttfts = [r.first_token - r.start for r in ok if r.first_token is not None]
    gaps = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    return wall, ttfts, gaps, sum(r.output_tokens for r in ok)


async def _vllm(url: str, concurrency: int, requests: int, tokens: int) -> tuple[float, list, list, int]:
    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions

    # the session vllm bench serve opens (vllm/benchmarks/serve.py)
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency, ttl_dns_cache=300,
                                     use_dns_cache=True, keepalive_timeout=60, enable_cleanup_closed=True,
                                     force_close=False)
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(connector=connector, trust_env=True,
                                     timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)) as session:
        async def one() -> object:
            async with sem:
                return await async_request_openai_completions(
                    RequestFuncInput(prompt=PROMPT, api_url=f"{url}/v1/completions", prompt_len=len(PROMPT),
                                     output_len=tokens, model="bench", ignore_eos=True), session)

        t0 = time.perf_counter()
        outs = await asyncio.gather(*(one() for _ in range(requests)))
        wall = time.perf_counter() - t0
    ok = [o for o in outs if o.success]
    tokens = sum(o.output_tokens or len(o.itl) + 1 for o in ok)
    return wall, [o.ttft for o in ok], [g for o in ok for g in o.itl], tokens


def worker(ns: argparse.Namespace) -> int:
    fn = _ours if ns.worker == "speedmatrix" else _vllm
    wall, ttfts, gaps, toks = asyncio.run(fn(ns.url, ns.concurrency, ns.requests, ns.tokens))
    print(json.dumps({"wall_s": wall, "output_tokens": toks, "tok_s": toks / wall, "ttfts_s": ttfts,
                      "gaps_s": gaps}))
    return 0


def _start_streamer(port: int, core: int | None, *delay_args: str) -> subprocess.Popen:
    """The local streamer (tests/fast_streamer.py) in a session of its own, pinned to ``core`` (None: not pinned);
    returns once it accepts connections. The other bench scripts that measure a client start it here too."""
    pin = ["taskset", "-c", str(core)] if core is not None else []
    cmd = [*pin, sys.executable, str(REPO / "tests/fast_streamer.py"), str(port), *delay_args]
    proc = subprocess.Popen(cmd, start_new_session=True)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    raise SystemExit("streamer did not start")


def two_cores() -> list[int]:
    """This process's cores, at least two (one for the streamer, one for the client under test)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs two cores: one for the streamer, one for the client")
    return cores


def _run(who: str, url: str, core: int, c: int, n: int, tokens: int) -> dict:
    cmd = ["taskset", "-c", str(core), sys.executable, __file__, "--worker", who, "--url", url,
           "--concurrency", str(c), "--requests", str(n), "--tokens", str(tokens)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _err_stats(values: list[float], target_s: float) -> dict:
    errs = sorted(abs(v - target_s) * 1000 for v in values)
    return {"median_ms": statistics.median(v * 1000 for v in values),
            "median_abs_error_ms": statistics.median(errs),
            "p99_abs_error_ms": errs[min(len(errs) - 1, int(0.99 * len(errs)))]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", choices=["speedmatrix", "vllm_bench_serve"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--concurrency", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--requests", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, default=2048, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--levels", default="1,4,16,64,256", help="concurrency levels of the ingest test")
    ap.add_argument("--out", default=str(REPO / "bench/results/client_overhead.json"))
    ns = ap.parse_args()
    if ns.worker:
        return worker(ns)
    cores = two_cores()
    client_core, streamer_core = cores[0], cores[1]
    clients = ("speedmatrix", "vllm_bench_serve")
    doc: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
                 "cpu": platform.processor() or platform.machine(), "client_core": client_core,
                 "streamer_core": streamer_core, "ingest": [], "timing": []}
    port = free_port("127.0.0.1")
    proc = _start_streamer(port, streamer_core)
    url = f"http://127.0.0.1:{port}"
    try:
        for c in (int(x) for x in ns.levels.split(",")):
            n = max(2 * c, 48)
            rates = {w: [] for w in clients}
            for rnd in range(ns.rounds):
                for who in clients if rnd % 2 == 0 else clients[::-1]:
                    rates[who].append(_run(who, url, client_core, c, n, 2048)["tok_s"])
            row = {"concurrency": c, "requests": n, "tokens_per_request": 2048,
                   **{f"{w}_tok_s": statistics.median(rates[w]) for w in clients},
                   **{f"{w}_tok_s_rounds": rates[w] for w in clients}}
            doc["ingest"].append(row)
            print(json.dumps({k: v for k, v in row.items() if not k.endswith("rounds")}), flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
    ttft_ms, gap_ms = 50.0, 5.0
    port = free_port("127.0.0.1")
    proc = _start_streamer(port, streamer_core, "--ttft-ms", str(ttft_ms), "--gap-ms", str(gap_ms))
    url = f"http://127.0.0.1:{port}"
    try:
        for c in (1, 16, 64):
            row = {"concurrency": c, "injected_ttft_ms": ttft_ms, "injected_gap_ms": gap_ms}
            for who in clients:
                r = _run(who, url, client_core, c, 2 * c, 200)
                row[who] = {"ttft": _err_stats(r["ttfts_s"], ttft_ms / 1000),
                            "gap": _err_stats(r["gaps_s"], gap_ms / 1000)}
            doc["timing"].append(row)
            print(json.dumps(row), flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
    Path(ns.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
