#!/usr/bin/env python3
"""The host probe's repeatability, and what it reads on a busy host: speedmatrix.core.host.speed_probe (the
fixed piece of Python a server start times one core with) taken --samples times on an idle host, then again
while --busy processes spin on its cores. The spread of the idle samples is what two probes of one host differ
by with nothing changed; the busy samples show how much other work on the cores moves it (the probe keeps the
fastest of its nine rounds, so a round that found the core free sets it: it reads the core's pace more than how
busy the host is).

    .venv/bin/python bench/host_probe.py [--samples 30] [--busy N (default: the host's core count)]
        [--out bench/results/host_probe.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from speedmatrix.core import host  # noqa: E402


def _spin(stop_at: float) -> None:
    while time.time() < stop_at:
        pass


def _summary(values: list[float]) -> dict:
    med = statistics.median(values)
    return {"samples_ms": [round(v, 3) for v in values], "median_ms": round(med, 3), "min_ms": round(min(values), 3),
            "max_ms": round(max(values), 3), "max_from_median": round(max(abs(v / med - 1) for v in values), 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--busy", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=str(REPO / "bench/results/host_probe.json"))
    ns = ap.parse_args()
    idle = [host.speed_probe()["host_probe_ms"] for _ in range(ns.samples)]
    spinners = [multiprocessing.Process(target=_spin, args=(time.time() + 3600,)) for _ in range(ns.busy)]
    for p in spinners:
        p.start()
    try:
        time.sleep(1)
        busy = [host.speed_probe()["host_probe_ms"] for _ in range(ns.samples)]
    finally:
        for p in spinners:
            p.terminate()
            p.join()
    doc = {"machine": f"{host.cpu_model()}, {os.cpu_count()} cores", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "commit": host.commit(), "probe_rounds": 9, "idle": _summary(idle),
           f"busy_{ns.busy}_spinning": _summary(busy),
           "busy_over_idle": round(statistics.median(busy) / statistics.median(idle) - 1, 4)}
    Path(ns.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k not in ("idle", f"busy_{ns.busy}_spinning")}))
    print("idle:", {k: v for k, v in doc["idle"].items() if k != "samples_ms"})
    print("busy:", {k: v for k, v in doc[f"busy_{ns.busy}_spinning"].items() if k != "samples_ms"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
