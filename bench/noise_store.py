#!/usr/bin/env python3
"""How many stored runs the regression gate's noise estimate needs: one release against itself, with 0, 1, 2, ...
earlier runs of it in the store.

    .venv/bin/python bench/noise_store.py measure [--runs 6]     # the default experiment N times, one store
    .venv/bin/python bench/noise_store.py judge [--out bench/results/noise-store]

``measure``: the default experiment (``tiny-cpu``) ``--runs`` times, one after another, each from an empty results
folder (no cell restored), in one results root (``results-noise/``) whose store they all join. Run it on an idle
machine: the spread between the runs is what is measured.

``judge``: from that store (or ``--store``), every ordered pair of runs (the older as BASE) judged by
``speedmatrix regress``'s own function with k other runs of the same software in the store (k = 0 to N - 2; up
to ``--subsets`` of the k-subsets each pair can take, chosen in a fixed order). The software is the same in every
run, so every cell judged faster or slower is a false alarm, and every pair with one is a night the gate would
have failed (exit 1) for nothing; each k at each figure's level and at the run's (``--family-wise``). Then every
pair again with a fixed ``--min-effect`` (MIN_EFFECTS) and no store.
Writes ``OUT/noise-store.json`` (per k and per fixed minimum effect: pairs, cells and figures judged and with a
false alarm, the figures that fired), ``OUT/runs.json`` (each run's id and wall time,
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

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / ".venv" / "bin"
ROOT = REPO / "results-noise"
EXPERIMENT = "tiny-cpu"
MIN_EFFECTS = (10, 20, 30, 40, 50)  # percent


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


def judge(store_path: Path, out: Path, subsets: int, twice: bool = False) -> dict:
    sys.path.insert(0, str(REPO / "src"))
    from speedmatrix.history import regress as rg
    from speedmatrix.history import store

    if twice:  # the rule before the prediction interval: twice the stored runs' spread, once two runs are known
        rg.prediction_factor = lambda runs, level=0.95: 2.0 if runs >= 2 else 0.0

    found = store.runs(store_path, EXPERIMENT)
    found = found[found["status"] == "complete"]
    ids = list(found["run_id"])
    data = {rid: (store.cells(store_path, rid), store.requests(store_path, rid)) for rid in ids}
    def tally(tables) -> dict:
        pairs = alarms = cells = cell_alarms = figures = figure_alarms = 0
        fired: dict[str, int] = {}
        effects: list[float] = []
        for table in tables:
            rate = table[(table["figure"] == "request_tok_s") & table["change"].notna()] if "change" in table \
                else table.iloc[:0]
            effects += [float(x) for x in rate["min_effect"]]
            verdicts = rg.cell_verdicts(table)
            judged = verdicts[verdicts["verdict"] != rg.NOT_COMPARABLE]
            wrong = table[table["verdict"].isin([rg.FASTER, rg.SLOWER])]
            pairs += 1
            alarms += int(len(wrong) > 0)
            cells += len(judged)
            cell_alarms += int(judged["verdict"].isin([rg.FASTER, rg.SLOWER]).sum())
            figures += int((table["verdict"] != rg.NOT_COMPARABLE).sum())
            figure_alarms += len(wrong)
            for fig in wrong["figure"]:
                fired[fig] = fired.get(fig, 0) + 1
        return {"pairs_judged": pairs, "pairs_with_a_false_alarm": alarms,
                "share_of_pairs": round(alarms / pairs, 3) if pairs else None,
                "cells_judged": cells, "cells_with_a_false_alarm": cell_alarms,
                "share_of_cells": round(cell_alarms / cells, 4) if cells else None,
                "figures_judged": figures, "figures_with_a_false_alarm": figure_alarms,
                "share_of_figures": round(figure_alarms / figures, 4) if figures else None,
                "figures_that_fired": dict(sorted(fired.items())),
                # what the gate can see: the minimum effect of output tok/s per request, over the cells judged
                "request_tok_s_min_effect_median": round(float(np.median(effects)), 4) if effects else None}

    # the run-to-run spread itself: each cell's output tok/s per request (mean over its counted requests) in each
    # run, its coefficient of variation over the runs
    fig = next(f for f in rg.FIGURES if f.name == "request_tok_s")
    means: dict[str, list[float]] = {}
    for rid in ids:
        for key, g in data[rid][1].groupby(["server_id", "cell_id"]):
            v = fig.values(rg.counted(g))
            v = v[np.isfinite(v)]
            if len(v) >= rg.MIN_REQUESTS:
                means.setdefault("/".join(key), []).append(float(v.mean()))
    cvs = [float(np.std(m, ddof=1) / np.mean(m)) for m in means.values() if len(m) == len(ids)]
    spread = {"cells_in_every_run": len(cvs), "request_tok_s_cv_median": round(float(np.median(cvs)), 4),
              "request_tok_s_cv_range": [round(min(cvs), 4), round(max(cvs), 4)]}
    pairs = list(itertools.combinations(range(len(ids)), 2))
    per_k = []
    for family_wise in (False,) if twice else (False, True):
        for k in range(0, len(ids) - 1):
            def tables(k=k, family_wise=family_wise):
                for i, j in pairs:
                    others = [r for n, r in enumerate(ids) if n not in (i, j)]
                    for chosen in itertools.islice(itertools.combinations(others, k), subsets):
                        sib = [data[r] for r in chosen]
                        yield rg.regress(*data[ids[i]], *data[ids[j]], siblings=(sib, sib), family_wise=family_wise)
            per_k.append({"family_wise": family_wise, "stored_runs_besides_the_pair": k, **tally(tables())})
            print(json.dumps(per_k[-1]), file=sys.stderr, flush=True)
    # a fixed minimum effect for every figure instead (--min-effect): what the gate fires on at each
    fixed = []
    for pct in () if twice else MIN_EFFECTS:
        fixed.append({"min_effect_pct": pct, **tally(rg.regress(*data[ids[i]], *data[ids[j]], min_effect=pct / 100)
                                                      for i, j in pairs)})
        print(json.dumps(fixed[-1]), file=sys.stderr, flush=True)
    doc = {"experiment": EXPERIMENT, "runs": ids, "method": "speedmatrix.history.regress.regress, noise multiple 2, "
           "each pair (older as base) with k other runs as both sides' siblings", "subsets_per_pair": subsets,
           "rule": "twice the stored runs' spread" if twice else "a prediction interval (regress.prediction_factor)",
           "run_to_run": spread, "per_k": per_k, "fixed_min_effect": fixed,
           # how many times the run-to-run spread one more run may differ by chance, with m runs known: at each
           # figure's level (95 %) and at a whole run's over 300 figures (--family-wise, about a default run's)
           "prediction_factors": [{"runs": m, "each_figure": round(rg.prediction_factor(m), 2),
                                   "family_wise_300": round(rg.prediction_factor(m, 1 - 0.05 / 300), 2)}
                                  for m in (2, 3, 4, 5, 6, 10, 20, 30)]}
    out.mkdir(parents=True, exist_ok=True)
    (out / ("twice-the-spread.json" if twice else "noise-store.json")).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["measure", "judge"])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--store", type=Path, default=ROOT / "history.sqlite")
    ap.add_argument("--subsets", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "noise-store")
    ap.add_argument("--twice-the-spread", action="store_true", help="judge: by the rule before the prediction "
                    "interval (twice the stored runs' spread), into twice-the-spread.json")
    ns = ap.parse_args()
    if ns.step == "measure":
        measure(ns.runs, ns.out)
    else:
        judge(ns.store, ns.out, ns.subsets, ns.twice_the_spread)
    ns.out.mkdir(parents=True, exist_ok=True)
    with (ns.out / "command.txt").open("a") as f:
        f.write(f".venv/bin/python bench/noise_store.py {ns.step} --runs {ns.runs} --subsets {ns.subsets}"
                f"{' --twice-the-spread' * ns.twice_the_spread}  # on "
                f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores, {platform.platform()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
