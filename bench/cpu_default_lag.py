#!/usr/bin/env python3
"""Whose is the send lag of the default's open-loop cells on a small CPU host: the machine's or the client's?

    .venv/bin/python bench/cpu_default_lag.py [--out bench/results/cpu_default_lag.json]

Sends the default experiment's open-loop loads (its ``rate`` block: the rates, Poisson schedule, window, warm-up
and output length of config/experiments/tiny-cpu.yaml) with speedmatrix's client, the client check on, against
the local streamer (tests/fast_streamer.py, a token every ``--gap-ms``), under three conditions of the machine:

* ``idle``: nothing else runs: the lag is the client's own;
* ``busy``: one CPU-bound process per core, each in a session of its own (as the vLLM server runs: the workflow
  starts it with a new session), at the same priority as the client: the machine's cores taken as vLLM for the
  CPU takes them;
* ``busy_niced``: the same processes at nice 10 with their sessions' autogroup lowered too
  (``runtime.server_nice``, the default on the CPU since this measurement).

Every condition runs ``--rounds`` times, the conditions alternating. Figures per rate and condition: the send lag
(actual minus scheduled send, ms) at p50, p95 and max, the event loop's lag at p95, the client's CPU share and its
wait for a core (run-queue share). The default's own cells, measured against vLLM before and after the
priority change, are in bench/results/client_check_default/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from client_overhead import _start_streamer  # noqa: E402

from speedmatrix.core import host  # noqa: E402
from speedmatrix.serve.procs import free_port  # noqa: E402

HOG = "while True: pass"


def _hogs(n: int, nice: int) -> list[subprocess.Popen]:
    pre = None
    if nice:
        from speedmatrix.serve.broker import _lowered
        pre = _lowered(nice)
    return [subprocess.Popen([sys.executable, "-c", HOG], start_new_session=True, preexec_fn=pre) for _ in range(n)]


async def _cell(url: str, rate: float, block: dict, seed: int) -> dict:
    from speedmatrix.measure import arrivals, client, clientcheck

    arrival = arrivals.Arrival(rate, block.get("arrival", "poisson"), duration_s=float(block["duration_s"]),
                               warmup_s=float(block.get("warmup_s", 0)), seed=seed)
    schedule = arrival.schedule(1)
    opts = client.RequestOptions(max_tokens=int(block["max_tokens"]), ignore_eos=True, usage_per_chunk=False)
    async with clientcheck.ClientCheck() as check:
        _, records = await client.open_loop(url, "bench", [[1] * 16] * len(schedule), schedule, opts,
                                            counted=lambda t: arrivals.counted(t, arrival))
    lags = [max(0.0, r.start - r.scheduled) * 1000 for r in records if r.counted]
    from speedmatrix.measure.stats import percentile
    return {"requests": len(lags), "send_lag_p50_ms": percentile(lags, 50), "send_lag_p95_ms": percentile(lags, 95),
            "send_lag_max_ms": max(lags) if lags else None, **check.figures(records)}


def main() -> int:
    import yaml

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiment", default=str(REPO / "config/experiments/tiny-cpu.yaml"))
    ap.add_argument("--gap-ms", type=float, default=10.0, help="the streamer's time between tokens")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "bench/results/cpu_default_lag.json"))
    ns = ap.parse_args()
    block = yaml.safe_load(Path(ns.experiment).read_text())["workloads"]["rate"]
    cores = len(os.sched_getaffinity(0))
    port = free_port("127.0.0.1")
    streamer = _start_streamer(port, None, "--gap-ms", str(ns.gap_ms))
    url = f"http://127.0.0.1:{port}"
    conditions = {"idle": (0, 0), "busy": (cores, 0), "busy_niced": (cores, 10)}
    runs: dict = {c: {str(r): [] for r in block["rates"]} for c in conditions}
    try:
        for rnd in range(ns.rounds):
            for cond, (n, nice) in conditions.items():
                hogs = _hogs(n, nice)
                try:
                    time.sleep(0.5)
                    for rate in block["rates"]:
                        row = asyncio.run(_cell(url, float(rate), block, int(block.get("seed", 0))))
                        runs[cond][str(rate)].append(row)
                        print(json.dumps({"round": rnd + 1, "condition": cond, "rate": rate, **row}), flush=True)
                finally:
                    for h in hogs:
                        h.kill()
                    for h in hogs:
                        h.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(streamer.pid, signal.SIGTERM)
    keys = ("send_lag_p50_ms", "send_lag_p95_ms", "send_lag_max_ms", "client_loop_lag_p95_ms", "client_cpu_share",
            "client_runqueue_share")
    summary = {cond: {rate: {k: statistics.median(r[k] for r in rows) for k in keys}
                      for rate, rows in by_rate.items()} for cond, by_rate in runs.items()}
    doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(), "cores": cores,
           "cpu_model": host.cpu_model(),
           "experiment": str(Path(ns.experiment).relative_to(REPO)), "rate_block": block, "gap_ms": ns.gap_ms,
           "rounds": ns.rounds, "medians": summary, "runs": runs}
    Path(ns.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
