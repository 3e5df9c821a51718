#!/usr/bin/env python3
"""What a CPU server's priority does to the client: two decode cells of the default experiment, run by the
workflow with the server at the client's priority (``runtime.server_nice: 0``) and at the default's (10), in
alternating rounds, each round a fresh server.

    .venv/bin/python bench/server_priority.py [--rounds 2] [--out bench/results/server_priority.csv]

Each round copies config/experiments/tiny-cpu.yaml with ``runtime.server_nice`` set, runs the workflow for
the base config's decode cells at context 128 with 1 and 16 requests in flight (a fresh results folder under
/tmp, so every cell is measured), and keeps the cells' rows: output tok/s and the client check (the loop's lag,
the client's CPU share, its wait for a core).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CELLS = ("decode-ctx128-c1-temp0-fp0.5", "decode-ctx128-c16-temp0-fp0.5")
KEYS = ("output_throughput", "client_loop_lag_p50_ms", "client_loop_lag_p95_ms", "client_loop_lag_max_ms",
        "client_cpu_share", "client_runqueue_share", "machine_busy_share", "status", "status_reason", "started_at")


def run(nice: int, work: Path) -> list[dict]:
    data = yaml.safe_load((REPO / "config/experiments/tiny-cpu.yaml").read_text())
    data["runtime"]["server_nice"] = nice
    exps = work / "experiments"
    exps.mkdir(parents=True, exist_ok=True)
    name = f"tiny-cpu-nice{nice}"
    (exps / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    results = work / "results"
    targets = [str(results / name / "cells" / "base" / f"{c}.json") for c in CELLS]
    cmd = [str(REPO / ".venv/bin/snakemake"), "--snakefile", str(REPO / "Snakefile"), "--directory", str(REPO),
           "--workflow-profile", str(REPO / "profiles/default"), "--config", f"experiment={name}",
           f"experiments_dir={exps}", f"results_dir={results}", "--", *targets]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = []
    for cell, target in zip(CELLS, targets):
        res = json.loads(Path(target).read_text())["result"]
        rows.append({"server_nice": nice, "cell_id": cell, **{k: res.get(k) for k in KEYS}})
    return rows


def main() -> int:
    import pandas as pd

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "bench/results/server_priority.csv"))
    ns = ap.parse_args()
    rows = []
    for rnd in range(ns.rounds):
        for nice in (0, 10) if rnd % 2 == 0 else (10, 0):
            with tempfile.TemporaryDirectory() as work:
                for row in run(nice, Path(work)):
                    rows.append({"round": rnd + 1, **row})
                    print(json.dumps(rows[-1]), flush=True)
    pd.DataFrame(rows).to_csv(ns.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
