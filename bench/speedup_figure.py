#!/usr/bin/env python3
"""Which per-request figure a speculative config's speed-up over its twin is judged on: for each tracked run with a
speculative config and its twin, each headline cell both measured usably, the ratio of the matrix's output tok/s
(the cell's tokens over its window) beside the ratio of two per-request means: ``request_tok_s`` (1000 / TPOT,
the run-to-run verdict's figure) and ``served_tok_s`` (a request's tokens over its whole time).

    .venv/bin/python bench/speedup_figure.py [--out bench/results/speedup_figure.json]

Prints a row per cell and writes the rows and, per figure, the largest distance of its ratio from the matrix's
(over every cell, and over the cells Valid on both sides).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from speedmatrix.core.runfolder import RunFolder  # noqa: E402
from speedmatrix.core.status import USABLE  # noqa: E402
from speedmatrix.history import regress  # noqa: E402
from speedmatrix.plan import experiment  # noqa: E402

RUNS = {"docs/results/tiny-cpu-decisions": "tiny-cpu", "docs/results/tiny-cpu-trained": "tiny-cpu",
        "docs/results/h200-tiny-trained-spec": "h200-tiny-trained-spec"}
FIGURES = {f.name: f for f in regress.FIGURES if f.name in ("request_tok_s", "served_tok_s")}


def rows(run: Path, name: str) -> list[dict]:
    exp = experiment.load(name)
    m = pd.read_parquet(run / "matrix.parquet")
    m = m[(m["workload"] == "decode") & m["status"].isin(USABLE)].set_index(["server_id", "cell_id"])
    folder = RunFolder(run)
    reqs = regress.counted(pd.read_parquet(folder.requests) if folder.requests.exists() else  # else: its cells' own
                           pd.concat(map(pd.read_parquet, folder.cell_request_files()), ignore_index=True))
    by = dict(iter(reqs.groupby(["server_id", "cell_id"])))
    out = []
    for srv in exp.servers:
        twin = exp.twin_of(srv.id)
        if not twin:
            continue
        for (sid, cid), r in m.loc[[k for k in m.index if k[0] == srv.id]].iterrows():
            if (twin, cid) not in m.index or (sid, cid) not in by or (twin, cid) not in by:
                continue
            row = {"run": str(run.relative_to(REPO)), "config": sid, "twin": twin, "cell": cid,
                   "matrix_ratio": round(float(r["total_tok_s"] / m.loc[(twin, cid), "total_tok_s"]), 3),
                   "both_valid": bool(r["status"] == "valid" and m.loc[(twin, cid), "status"] == "valid")}
            for name_, fig in FIGURES.items():
                new, base = fig.values(by[(sid, cid)]), fig.values(by[(twin, cid)])
                row[f"{name_}_ratio"] = round(float(np.nanmean(new) / np.nanmean(base)), 3)
            out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "speedup_figure.json")
    a = ap.parse_args()
    table = [r for run, name in RUNS.items() for r in rows(REPO / run, name)]
    for r in table:
        print(r)
    def worst(rows: list[dict]) -> dict:
        return {f: round(max(abs(r[f"{f}_ratio"] / r["matrix_ratio"] - 1) for r in rows), 3) for f in FIGURES}

    valid = [r for r in table if r["both_valid"]]
    # (a cell whose repeats disagree, Unstable, has a median of repeats and a mean over all its requests apart)
    summary = {"cells": len(table), "largest_distance_from_matrix_ratio": worst(table),
               "cells_both_valid": len(valid), "largest_distance_both_valid": worst(valid)}
    print(summary)
    a.out.write_text(json.dumps({"summary": summary, "rows": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
