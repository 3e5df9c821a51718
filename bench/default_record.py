#!/usr/bin/env python3
"""The default run's record: a fresh clone's `make run`, timed, and what it made, in docs/results/default/.

    python3 bench/default_record.py [--rev HEAD] [--out docs/results/default]

Runs bench/make_run_times.py on a fresh clone of ``--rev`` (its install, its first `make run` of the default
experiment and a second one with nothing to do, on this machine as it is: run it idle), keeps the clone, and
writes into ``--out``:

- ``record.json``: the commit, the experiment and its digest (``Experiment.digest``: its file and the dataset
  files it names), the machine, the date, the install and run times, the jobs and cells, the statuses;
- ``make_run_times.json``: the timing script's own output (with ``speedmatrix walltime``'s split of the run);
- ``report.md``, ``run-summary.json``, ``matrix.csv`` (every cell's row), the losslessness verdicts;
- ``README.md``, written from ``record.json``;

and the run's report's first screen at 1440 x 900 into ``--screenshot`` (the README's picture; where chromium
and chromium-driver are installed).

tests/test_default_record.py fails when the default experiment no longer has the record's digest (a change of
the default comes with its new record) and when README.md or docs/running.md give a run time other than the
record's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
EXPERIMENT = "tiny-cpu"

from speedmatrix.core import fmt  # noqa: E402
from speedmatrix.jobs.preflight import RECORD  # noqa: E402  (where `make run` reads the record from)


def run_time_phrase(rec: dict) -> str:
    """How README.md and docs/running.md give the default's run time (tests/test_default_record.py checks it)."""
    return (f"the install took {fmt.minutes(rec['install_s'])} and the run "
            f"{fmt.minutes(rec['first_run_s'])}")


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def without_charts(report_md: str) -> str:
    """The report's markdown with each chart's picture named instead of shown: the PNGs (about 3 MB) are not kept in
    the record (the report rule draws them again from the run's matrix)."""
    return re.sub(r"^!\[([^\]]*)\]\(charts/[^)]+\)$", r"*Chart: \1 (its picture is not kept in this record).*",
                  report_md, flags=re.M)


def readme(rec: dict) -> str:
    counts = ", ".join(f"{n} {fmt.status(s)}" for s, n in rec["statuses"].items())
    # the clone's scratch path is not the reader's: the run's folder as `make run` names it
    split = [re.sub(r"^\S*/(results/)", r"\1", line) for line in rec["walltime_lines"]]
    return f"""# The default experiment's last run

Written by `bench/default_record.py` from `record.json` (do not edit by hand: run the script again). It ran
`{rec['command']}` on a fresh clone of commit `{rec['commit'][:12]}`, experiment `{rec['experiment_file']}`
(digest `{rec['experiment_digest'][:16]}`, its file and the dataset files it names), on {rec['machine']}, idle,
with a {rec['package_cache']} package cache, on {rec['date'][:10]}.

| | |
|---|---|
| install (`make run`'s, the first time) | {fmt.minutes(rec['install_s'])} |
| the run (`make run`) | {fmt.minutes(rec['first_run_s'])} |
| a fresh clone's `make run`, both together | {fmt.minutes(rec['fresh_make_run_s'])} |
| a second `make run` (nothing to do) | {fmt.minutes(rec['noop_run_s'])} |
| jobs, cells, server starts | {rec['jobs']} jobs, {rec['cells']} cells, {rec['server_starts']} server starts |
| statuses | {counts} |

Where the run's wall time went (`speedmatrix walltime`, in `make_run_times.json`):

{chr(10).join('    ' + line for line in split)}

Files: `record.json`, `make_run_times.json`, `report.md` (the run's report as markdown), `run-summary.json`,
`matrix.csv` (every cell's row of matrix.parquet), `lossless/` (the losslessness check's verdicts).
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--out", type=Path, default=REPO / RECORD.parent)
    ap.add_argument("--readme", action="store_true", help="only write README.md again from the record.json there")
    ap.add_argument("--screenshot", type=Path, default=REPO / "docs" / "images" / "report-first-screen.png",
                    help="where the run's report's first screen goes (bench/report_screenshot.py; '' for none)")
    a = ap.parse_args()
    out = a.out
    if a.readme:
        (out / "README.md").write_text(readme(json.loads((out / "record.json").read_text())))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    times = out / "make_run_times.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "make_run_times.py"), "--keep", "--rev", a.rev,
                           "--out", str(times)], capture_output=True, text=True)
    made = json.loads(times.read_text())
    if proc.returncode != 0 or "failed" in made:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        return 1
    clone = Path(made["kept"])
    res = clone / "results" / EXPERIMENT
    import pandas as pd

    from speedmatrix.plan import experiment

    exp = experiment.load(EXPERIMENT, clone / "config" / "experiments")
    matrix = pd.read_parquet(res / "matrix.parquet")
    matrix.to_csv(out / "matrix.csv", index=False, float_format="%.6g")
    summary = json.loads((res / "run-summary.json").read_text())
    (out / "report.md").write_text(without_charts((res / "report.md").read_text()))
    shutil.copy(res / "run-summary.json", out / "run-summary.json")
    if (out / "lossless").exists():
        shutil.rmtree(out / "lossless")
    for v in res.glob("lossless/*/verdict-*.json"):
        (out / "lossless").mkdir(exist_ok=True)
        shutil.copy(v, out / "lossless" / v.name)
    cwd = os.getcwd()
    os.chdir(clone)  # the dataset paths are relative to the repository
    try:
        digest = exp.digest()
    finally:
        os.chdir(cwd)
    rec = {
        "commit": made["commit"], "experiment": EXPERIMENT, "experiment_file": f"config/experiments/{EXPERIMENT}.yaml",
        "experiment_digest": digest, "machine": f"{cpu_model()}, {made['machine']}, "
        f"{round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB",
        "date": made["date"], "package_cache": made["package_cache"], "command": "make run",
        "install_s": made["install_s"], "first_run_s": made["first_run_s"], "noop_run_s": made["noop_run_s"],
        "fresh_make_run_s": made["fresh_make_run_s"], "jobs": summary["jobs"],
        "cells": len(matrix), "server_starts": sum(made["server_starts"].values()),
        "statuses": {str(k): int(n) for k, n in matrix["status"].value_counts().items()},
        "walltime_lines": made.get("first_run_split", []),
    }
    (out / "record.json").write_text(json.dumps(rec, indent=2) + "\n")
    (out / "README.md").write_text(readme(rec))
    print(json.dumps(rec, indent=2))
    if a.screenshot:  # the report's first screen as the README shows it (needs chromium and chromium-driver)
        shot = subprocess.run([sys.executable, str(REPO / "bench" / "report_screenshot.py"), str(res / "report.html"),
                               str(a.screenshot)], capture_output=True, text=True)
        print(shot.stdout.strip() or f"no screenshot: {shot.stderr.strip()[-500:]}")
    shutil.rmtree(clone.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
