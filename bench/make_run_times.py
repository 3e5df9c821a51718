#!/usr/bin/env python3
"""Measure the set-up and run times of a fresh clone: install, first run, no-op run.

    python3 bench/make_run_times.py [--cold] [--keep] [--rev REV] [--out bench/results/make_run_times.json]

Clones the committed HEAD (or ``--rev``, to measure an earlier commit the same way) into a scratch
directory (a fresh clone: no .venv, no results, no models), then times the install `make run` does (the package
and its engine, without the test tools), `make run` (the default
experiment) and a second `make run` that has nothing to do, counts the server
starts, and splits the first run's wall time with `speedmatrix walltime`.

With ``--cold`` pip's and uv's package caches and vLLM's cache are empty folders of
the scratch directory (``PIP_CACHE_DIR``, ``UV_CACHE_DIR``, ``VLLM_CACHE_ROOT``): every package is
downloaded again (what pip's configuration finds on local disk, e.g. a wheel
folder named by ``find-links``, is still found there). Without it, whatever
the machine's caches hold is used (a warm cache after any earlier install).

Targets: a fresh clone's install + first run <= 6 min with a warm package
cache and <= 9 min cold, on an idle 2-core machine; a no-op run <= 5 s of
Snakemake; one server start per server config.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int, str]:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    return time.monotonic() - t0, proc.returncode, proc.stdout + proc.stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", action="store_true", help="keep the scratch clone")
    ap.add_argument("--cold", action="store_true", help="empty package and vLLM caches (see above)")
    ap.add_argument("--rev", default="HEAD", help="the commit to clone (default: HEAD)")
    ap.add_argument("--out", default=str(REPO / "bench/results/make_run_times.json"))
    ns = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="speedmatrix-bench-"))
    clone = scratch / "speedmatrix"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "checkout", "--quiet", ns.rev], cwd=clone, check=True)
    result: dict = {"commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True,
                                             text=True).stdout.strip(),
                    "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                    "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "package_cache": "cold (empty PIP_CACHE_DIR, UV_CACHE_DIR, VLLM_CACHE_ROOT)" if ns.cold else "warm"}
    env = dict(os.environ)
    if ns.cold:
        env.update(PIP_CACHE_DIR=str(scratch / "pip-cache"), UV_CACHE_DIR=str(scratch / "uv-cache"),
                   VLLM_CACHE_ROOT=str(scratch / "vllm-cache"))
    tails = {}
    # the install `make run` does (the package and its engine; `make test` adds the test tools)
    for step, cmd in (("install_s", ["make", ".venv/.speedmatrix-installed"]), ("first_run_s", ["make", "run"]),
                      ("noop_run_s", ["make", "run"])):
        secs, rc, tail = timed(cmd, clone, env)
        result[step] = round(secs, 1)
        tails[step] = tail
        if rc != 0:
            result["failed"] = {"step": step, "rc": rc, "tail": tail[-2000:]}
            break
    res = clone / "results" / "tiny-cpu"
    result["server_starts"] = {p.parent.name: len(p.read_text().splitlines())
                               for p in res.glob("servers/*/starts.jsonl")}
    result["server_configs"] = len(list(res.glob("servers/*/launch.json")))
    result["fresh_make_run_s"] = round(result.get("install_s", 0) + result.get("first_run_s", 0), 1)
    # what the no-op run's Snakemake itself took (its own line), without make's and the shell's start
    elapsed = re.findall(r"Elapsed time: (\d+):(\d\d):(\d\d(?:\.\d+)?)", tails.get("noop_run_s", ""))
    if elapsed:
        h, m, sec = elapsed[-1]
        result["noop_snakemake_elapsed_s"] = round(int(h) * 3600 + int(m) * 60 + float(sec), 2)
    # the report line the run ends with (where the page is and how to open it)
    said = [ln for ln in tails.get("first_run_s", "").splitlines() if "the report is" in ln]
    result["first_run_says"] = said[-1] if said else None
    over = subprocess.run([str(clone / ".venv/bin/speedmatrix"), "walltime", str(res)],
                          capture_output=True, text=True)
    result["first_run_split"] = over.stdout.strip().splitlines()
    split = subprocess.run([str(clone / ".venv/bin/speedmatrix"), "walltime", str(res), "--out",
                            str(scratch / "w.json")], capture_output=True, text=True)
    if split.returncode == 0 and (scratch / "w.json").exists():
        parts = json.loads((scratch / "w.json").read_text())
        # the server jobs' time outside windows and start-ups ("cell jobs outside ..." before the losslessness
        # check's and the gates' jobs counted with the cells')
        inside = next((v for k, v in parts["parts_s"].items()
                       if k.startswith(("server jobs outside", "cell jobs outside"))), None)
        result["cell_job_outside_window_s_per_cell"] = (round(inside / parts["cells"], 2)
                                                        if parts["cells"] and inside is not None else None)
        if parts.get("cell_jobs_own_s_per_cell") is not None:  # the jobs' own work, requests sent outside windows aside
            result["cell_job_own_s_per_cell"] = round(parts["cell_jobs_own_s_per_cell"], 3)
        result["walltime"] = parts
    if ns.keep:
        result["kept"] = str(clone)
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if not ns.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0 if "failed" not in result else 1


if __name__ == "__main__":
    raise SystemExit(main())
