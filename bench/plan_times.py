#!/usr/bin/env python3
"""Time `make plan` (a Snakemake dry run with job counts) on large generated experiments.

    .venv/bin/python bench/plan_times.py [--out bench/results/plan_times.json]

Generates, in a scratch experiments dir, (a) a seed-002-shaped matrix (one
server config, prefill at 7 contexts, decode at 6 contexts x 8 concurrency
levels) and (b) a 1,000-cell experiment (10 server configs x 10 contexts x 10
concurrency levels), and times the dry run of each with the default and the
SLURM profile. Targets: seed-002 <= 10 s, 1,000 cells <= 30 s.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def experiments(base: dict) -> dict[str, dict]:
    seed002 = copy.deepcopy(base)
    seed002["servers"] = [{"id": "gemma"}]
    seed002["workloads"] = {
        "prefill": {"contexts": [8192, 16384, 32768, 65536, 131072, 257024, 262144], "repeats": 1},
        "decode": {"contexts": [8192, 16384, 32768, 65536, 131072, 257024],
                   "concurrency": [1, 2, 4, 8, 16, 32, 64, 128], "duration_s": 30, "max_tokens": 4096},
    }
    big = copy.deepcopy(base)
    big["servers"] = [{"id": f"s{i}", "args": {"max-num-seqs": 16 * (i + 1)}} for i in range(10)]
    big["workloads"] = {"decode": {"contexts": [128 * (k + 1) for k in range(10)],
                                   "concurrency": [1 + k for k in range(10)], "duration_s": 5, "max_tokens": 64}}
    return {"plan-seed002-shape": seed002, "plan-1000-cells": big}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "bench/results/plan_times.json"))
    ns = ap.parse_args()
    base = yaml.safe_load((REPO / "config/experiments/tiny-cpu.yaml").read_text())
    scratch = Path(tempfile.mkdtemp(prefix="speedmatrix-plan-"))
    (scratch / "experiments").mkdir()
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": []}
    for name, exp in experiments(base).items():
        (scratch / "experiments" / f"{name}.yaml").write_text(yaml.safe_dump(exp))
        for profile in ("default", "slurm"):
            cmd = [sys.executable, "-m", "snakemake", "--workflow-profile", f"profiles/{profile}", "--config",
                   f"experiment={name}", f"experiments_dir={scratch / 'experiments'}",
                   f"results_dir={scratch / 'results'}", f"models_dir={scratch / 'models'}",
                   "--dry-run", "--quiet", "rules"]
            t0 = time.monotonic()
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            secs = time.monotonic() - t0
            cells = next((int(line.split()[-1]) for line in proc.stdout.splitlines()
                          if line.strip().startswith("cell ")), None)
            out["runs"].append({"experiment": name, "profile": profile, "seconds": round(secs, 2),
                                "cell_jobs": cells, "rc": proc.returncode})
            print(json.dumps(out["runs"][-1]), flush=True)
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0 if all(r["rc"] == 0 for r in out["runs"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
