#!/usr/bin/env python3
"""What starting a job costs before it does anything: the imports of a cell job's script, and of the workflow's
own rule files (every job Snakemake runs parses the workflow again in a process of its own).

    python3 bench/job_start.py [--checkout DIR] [--runs 7] [--out FILE]

Each figure is a fresh interpreter of the checkout's ``.venv`` importing what that script imports, timed from
outside (``time.perf_counter`` around ``subprocess.run``, the interpreter's own start included) and by Python's
``-X importtime`` (the package's cumulative import time); the medians of ``--runs`` runs. The import lists are
read from the checkout's own files (``workflow/scripts/cell.py``, ``rules/common.smk``), so an earlier commit is
measured by the same rule.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMPORT = re.compile(r"^(from speedmatrix[\w.]* import [\w, ]+(?: as \w+)?|import speedmatrix[\w.]*)", re.M)


def imports_of(path: Path) -> str:
    return "\n".join(IMPORT.findall(path.read_text()))


def measure(python: Path, code: str, runs: int) -> dict:
    walls, cumul = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run([str(python), "-X", "importtime", "-c", code], capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-2000:])
        # the top-level speedmatrix modules' cumulative microseconds (each line: self | cumulative | name)
        top = [int(line.split("|")[1]) for line in proc.stderr.splitlines()
               if re.search(r"\|\s*speedmatrix[\w.]*\s*$", line) and not re.search(r"\|\s{2,}speedmatrix", line)]
        cumul.append(sum(top) / 1e6)
    return {"process_s_median": round(statistics.median(walls), 3),
            "imports_s_median": round(statistics.median(cumul), 3), "runs": runs}


def load_and_expand(python: Path, checkout: Path, runs: int) -> float:
    code = ("import time\ntry:\n    from speedmatrix.plan import experiment\nexcept ImportError:\n"
            "    from speedmatrix import experiment\nt0 = time.perf_counter()\n"
            "experiment.load('tiny-cpu', 'config/experiments').cells()\nprint(time.perf_counter() - t0)")
    got = [float(subprocess.run([str(python), "-c", code], cwd=checkout, capture_output=True, text=True,
                                check=True).stdout) for _ in range(runs)]
    return round(statistics.median(got), 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkout", type=Path, default=REPO)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", type=Path)
    ns = ap.parse_args()
    python = ns.checkout / ".venv" / "bin" / "python"
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ns.checkout, capture_output=True,
                            text=True).stdout.strip()
    got = {"commit": commit,
           "cell_script": measure(python, imports_of(ns.checkout / "workflow/scripts/cell.py"), ns.runs),
           "workflow_rules": measure(python, imports_of(ns.checkout / "rules/common.smk"), ns.runs),
           "bare_interpreter": measure(python, "pass", ns.runs),
           # what a cell job of an earlier version did before its first log line: load, check and expand the
           # experiment to find its cell (a job now gets its cell from its rule)
           "experiment_load_and_expand_s_median": load_and_expand(python, ns.checkout, ns.runs)}
    text = json.dumps(got, indent=2)
    print(text)
    if ns.out:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
