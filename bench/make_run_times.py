#!/usr/bin/env python3
"""Measure the set-up and run times of a fresh clone: install, first run, no-op run.

    python3 bench/make_run_times.py [--keep] [--out bench/results/make_run_times.json]

Clones the committed HEAD into a scratch directory (a fresh clone: no .venv,
no results), then times `make install`, `make run` (the default experiment)
and a second `make run` that has nothing to do, and counts the server starts.
Targets (issue 2): install + run <= 15 min, run <= 8 min, no-op run <= 20 s,
server starts == server configs.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], cwd: Path) -> tuple[float, int, str]:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return time.monotonic() - t0, proc.returncode, (proc.stdout + proc.stderr)[-2000:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", action="store_true", help="keep the scratch clone")
    ap.add_argument("--out", default=str(REPO / "bench/results/make_run_times.json"))
    ns = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="speedmatrix-bench-"))
    clone = scratch / "speedmatrix"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    result: dict = {"commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True,
                                             text=True).stdout.strip(),
                    "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
                    "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for step, cmd in (("install_s", ["make", "install"]), ("first_run_s", ["make", "run"]),
                      ("noop_run_s", ["make", "run"])):
        secs, rc, tail = timed(cmd, clone)
        result[step] = round(secs, 1)
        if rc != 0:
            result["failed"] = {"step": step, "rc": rc, "tail": tail}
            break
    res = clone / "results" / "tiny-cpu"
    result["server_starts"] = {p.parent.name: len(p.read_text().splitlines())
                               for p in res.glob("servers/*/starts.jsonl")}
    result["server_configs"] = len(list(res.glob("servers/*/launch.json")))
    result["fresh_make_run_s"] = round(result.get("install_s", 0) + result.get("first_run_s", 0), 1)
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if not ns.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0 if "failed" not in result else 1


if __name__ == "__main__":
    raise SystemExit(main())
