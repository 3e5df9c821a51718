#!/usr/bin/env python3
"""How many stored runs the regression gate's noise estimate needs: one release against itself, with 0, 1, 2, ...
earlier runs of it in the store.

    python3 bench/noise_store.py measure [--runs 6]     # the default experiment N times, one store
    python3 bench/noise_store.py judge [--out bench/results/noise-store]

``measure``: the default experiment (``tiny-cpu``) ``--runs`` times, one after another, each from an empty results
folder (no cell restored), in one results root (``results-noise/``) whose store they all join. Run it on an idle
machine: the spread between the runs is what is measured.

``judge``: from that store (or ``--store``), every ordered pair of runs (the older as BASE) judged by
``speedmatrix regress``'s own function with k other runs of the same software in the store (k = 0 to N - 2; up
to ``--subsets`` of the k-subsets each pair can take, chosen in a fixed order). The software is the same in every
run, so every cell judged faster or slower is a false alarm, and every pair with one is a night the gate would
have failed (exit 1) for nothing. Writes ``OUT/noise-store.json`` (per k: pairs judged, pairs with a false alarm,
cells judged and cells with a false alarm, the figures that fired), ``OUT/runs.json`` (each run's id and wall time,
from ``measure``) and ``OUT/command.txt``.
"""

from __future__ import annotations

import argparse
import itertools
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
ROOT = REPO / "results-noise"
EXPERIMENT = "tiny-cpu"


def measure(runs: int, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    done = []
    for i in range(runs):
        shutil.rmtree(ROOT / EXPERIMENT, ignore_errors=True)  # measured again, nothing restored
        t0 = time.monotonic()
        proc = subprocess.run([str(BIN / "snakemake"), "--workflow-profile", "profiles/default", "--config",
                               f"experiment={EXPERIMENT}", f"results_dir={ROOT.relative_to(REPO)}"], cwd=REPO)
        done.append({"run": i + 1, "exit": proc.returncode, "wall_s": round(time.monotonic() - t0, 1)})
        print(json.dumps(done[-1]), file=sys.stderr, flush=True)
    (out / "runs.json").write_text(json.dumps({"experiment": EXPERIMENT, "runs": done}, indent=1) + "\n")


def judge(store_path: Path, out: Path, subsets: int) -> dict:
    sys.path.insert(0, str(REPO / "src"))
    from speedmatrix.history import regress as rg
    from speedmatrix.history import store

    found = store.runs(store_path, EXPERIMENT)
    found = found[found["status"] == "complete"]
    ids = list(found["run_id"])
    data = {rid: (store.cells(store_path, rid), store.requests(store_path, rid)) for rid in ids}
    per_k = []
    for k in range(0, len(ids) - 1):
        pairs = alarms = cells = cell_alarms = 0
        fired: dict[str, int] = {}
        for i, j in itertools.combinations(range(len(ids)), 2):
            others = [r for n, r in enumerate(ids) if n not in (i, j)]
            for chosen in itertools.islice(itertools.combinations(others, k), subsets):
                sib = [data[r] for r in chosen]
                table = rg.regress(*data[ids[i]], *data[ids[j]], siblings=(sib, sib))
                verdicts = rg.cell_verdicts(table)
                judged = verdicts[verdicts["verdict"] != rg.NOT_COMPARABLE]
                wrong = table[table["verdict"].isin([rg.FASTER, rg.SLOWER])]
                pairs += 1
                alarms += int(len(wrong) > 0)
                cells += len(judged)
                cell_alarms += int(judged["verdict"].isin([rg.FASTER, rg.SLOWER]).sum())
                for fig in wrong["figure"]:
                    fired[fig] = fired.get(fig, 0) + 1
        per_k.append({"stored_runs_besides_the_pair": k, "pairs_judged": pairs, "pairs_with_a_false_alarm": alarms,
                      "share_of_pairs": round(alarms / pairs, 3) if pairs else None,
                      "cells_judged": cells, "cells_with_a_false_alarm": cell_alarms,
                      "share_of_cells": round(cell_alarms / cells, 4) if cells else None,
                      "figures_that_fired": dict(sorted(fired.items()))})
        print(json.dumps(per_k[-1]), file=sys.stderr, flush=True)
    doc = {"experiment": EXPERIMENT, "runs": ids, "method": "speedmatrix.history.regress.regress, noise multiple 2, "
           "each pair (older as base) with k other runs as both sides' siblings", "subsets_per_pair": subsets,
           "per_k": per_k}
    out.mkdir(parents=True, exist_ok=True)
    (out / "noise-store.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["measure", "judge"])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--store", type=Path, default=ROOT / "history.sqlite")
    ap.add_argument("--subsets", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "noise-store")
    ns = ap.parse_args()
    if ns.step == "measure":
        measure(ns.runs, ns.out)
    else:
        judge(ns.store, ns.out, ns.subsets)
    ns.out.mkdir(parents=True, exist_ok=True)
    with (ns.out / "command.txt").open("a") as f:
        f.write(f"python3 bench/noise_store.py {ns.step} --runs {ns.runs} --subsets {ns.subsets}  # on "
                f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores, {platform.platform()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
