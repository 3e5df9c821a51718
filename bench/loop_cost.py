#!/usr/bin/env python3
"""Cost of the online loop watch: the client's CPU time on 4,096-token streams, with the watch and without.

    .venv/bin/python bench/loop_cost.py [--requests 40] [--out bench/results/loop_cost.json]

The local streamer (tests/fast_streamer.py, pinned to one core) sends one
event per write, a seeded word each (text that does not loop, so the watch
runs to the end of every stream), 4,096 events per request, 20 microseconds
apart. The client (pinned to the other core) runs the requests one after
another, in a fresh process per setting, alternating the settings over the
rounds; its CPU time (user + system, ``time.process_time``) over the
requests is the figure, with the watch's own CPU time inside it measured
where it is spent (around its calls from the read loop). The watch is the
same code the cells run (``speedmatrix.measure.loops.OnlineWatch``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

from client_overhead import _start_streamer  # noqa: E402

from speedmatrix.serve.procs import free_port  # noqa: E402

TOKENS = 4096


async def _paired(url: str, requests: int, rounds: int) -> dict:
    """Both settings in one process, alternating batches: the process-to-process spread cancels out."""
    from speedmatrix.measure import client

    cpu = {"on": 0.0, "off": 0.0}
    for k in range(rounds):
        for setting in ("on", "off") if k % 2 == 0 else ("off", "on"):
            opts = client.RequestOptions(max_tokens=TOKENS, ignore_eos=True, usage_per_chunk=False,
                                         watch_loops=setting == "on")
            c0 = time.process_time()
            await client.fixed_count(url, "bench", lambda i: [1] * 16, requests, 1, opts)
            cpu[setting] += time.process_time() - c0
    return cpu


async def _run(url: str, requests: int, watch: bool) -> dict:
    from speedmatrix.measure import client, loops

    # the watch's own CPU time, measured where it is spent (its update calls from the read loop)
    spent = [0.0]
    update = loops.OnlineWatch.update

    def timed_update(self, parts):
        t = time.process_time()
        try:
            return update(self, parts)
        finally:
            spent[0] += time.process_time() - t

    loops.OnlineWatch.update = timed_update
    opts = client.RequestOptions(max_tokens=TOKENS, ignore_eos=True, usage_per_chunk=False, watch_loops=watch)
    c0 = time.process_time()
    wall, records = await client.fixed_count(url, "bench", lambda i: [1] * 16, requests, 1, opts)
    cpu = time.process_time() - c0
    assert all(r.output_tokens == TOKENS and not r.error for r in records), "a stream did not complete"
    return {"cpu_s": cpu, "watch_cpu_s": spent[0], "wall_s": wall, "tokens": sum(r.output_tokens for r in records),
            "chunks": sum(len(r.chunk_times) for r in records),
            "loops_seen": sum(r.loop_detected_at_token is not None for r in records)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", choices=["on", "off", "paired"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "bench/results/loop_cost.json"))
    ns = ap.parse_args()
    if ns.worker == "paired":
        print(json.dumps(asyncio.run(_paired(ns.url, 5, 2 * ns.rounds))))
        return 0
    if ns.worker:
        print(json.dumps(asyncio.run(_run(ns.url, ns.requests, ns.worker == "on"))))
        return 0
    cores = sorted(os.sched_getaffinity(0))
    port = free_port("127.0.0.1")
    proc = _start_streamer(port, cores[1], "--gap-ms", "0.02")
    url = f"http://127.0.0.1:{port}"
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    try:
        for rnd in range(ns.rounds):
            for setting in ("off", "on") if rnd % 2 == 0 else ("on", "off"):
                cmd = ["taskset", "-c", str(cores[0]), sys.executable, __file__, "--worker", setting, "--url", url,
                       "--requests", str(ns.requests)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                runs[setting].append(json.loads(out.strip().splitlines()[-1]))
                print(setting, runs[setting][-1], flush=True)
        cmd = ["taskset", "-c", str(cores[0]), sys.executable, __file__, "--worker", "paired", "--url", url,
               "--rounds", str(ns.rounds)]
        paired = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
    cpu = {k: statistics.median(r["cpu_s"] for r in v) for k, v in runs.items()}
    doc = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "tokens_per_stream": TOKENS,
        "requests_per_run": ns.requests,
        "client_cpu_s_median": cpu,
        "client_cpu_us_per_token": {k: 1e6 * v / (TOKENS * ns.requests) for k, v in cpu.items()},
        # the watch's own time inside the "on" runs, over the client's CPU time of those runs
        "watch_share_of_client_cpu_pct": 100 * statistics.median(r["watch_cpu_s"] / r["cpu_s"] for r in runs["on"]),
        # the same from the two settings' medians (noisier: the runs' CPU time varies by more than this)
        "watch_overhead_pct_ab": 100 * (cpu["on"] / cpu["off"] - 1),
        # one process, batches of 5 requests alternating on/off: CPU seconds per setting and the difference
        "paired_cpu_s": paired,
        "watch_overhead_pct_paired": 100 * (paired["on"] / paired["off"] - 1),
        "runs": runs,
    }
    Path(ns.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("client_cpu_s_median", "client_cpu_us_per_token",
                                          "watch_share_of_client_cpu_pct", "watch_overhead_pct_ab",
                                          "watch_overhead_pct_paired")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
