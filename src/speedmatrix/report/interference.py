"""Serial against parallel: what measuring side by side on a GPU pool changed, cell by cell.

    speedmatrix interference ALONE_RUN BESIDE_RUN [--again ALONE_RUN_2] [--out DIR]

ALONE_RUN is a finished run whose cells measured alone (``--config gpus=1``: one server at a time);
BESIDE_RUN the same experiment on a pool, cells side by side (matrix column ``ran_beside``). For each
cell: output tok/s, median TTFT, median time between tokens and prompt tok/s in both runs and the
difference; with ``--again`` (a second run alone) the same difference between the two lone runs,
which is the run-to-run spread a side-by-side difference has to exceed to mean anything. Wall time
and where it went come from speedmatrix.report.walltime. Writes ``interference.md`` and ``interference.json``
into DIR (default: print only).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from ..core.runfolder import RunFolder
from ..jobs import aggregate
from . import walltime

FIGURES = [("total_tok_s", "output tok/s"), ("ttft_ms", "median TTFT (ms)"),
           ("tbt_ms", "median time between tokens (ms)"), ("prompt_tok_s", "prompt tok/s")]



def _pct(new, old) -> float | None:
    if new is None or old is None or any(isinstance(v, float) and math.isnan(v) for v in (new, old)) or not old:
        return None
    return (float(new) / float(old) - 1.0) * 100.0


def compare(alone: Path, beside: Path, again: Path | None = None) -> dict:
    a = aggregate.read_matrix(RunFolder(alone).matrix).set_index(["server_id", "cell_id"])
    b = aggregate.read_matrix(RunFolder(beside).matrix).set_index(["server_id", "cell_id"])
    g = aggregate.read_matrix(RunFolder(again).matrix).set_index(["server_id", "cell_id"]) if again else None
    rows = []
    for key in b.index:
        if key not in a.index:
            continue
        row = {"server_id": key[0], "cell_id": key[1], "server_gpus": b.loc[key].get("server_gpus"),
               "ran_beside": b.loc[key].get("ran_beside")}
        for col, _ in FIGURES:
            alone_v, beside_v = a.loc[key].get(col), b.loc[key].get(col)
            row[f"{col}_alone"] = None if pd.isna(alone_v) else float(alone_v)
            row[f"{col}_beside"] = None if pd.isna(beside_v) else float(beside_v)
            row[f"{col}_delta_pct"] = _pct(beside_v, alone_v)
            if g is not None and key in g.index:
                row[f"{col}_again_delta_pct"] = _pct(g.loc[key].get(col), alone_v)
        rows.append(row)
    walls = {name: walltime.analyse(run) for name, run in (("alone", alone), ("beside", beside), ("again", again))
             if run is not None}
    return {"alone": str(alone), "beside": str(beside), "again": str(again) if again else None,
            "cells": rows, "runs": {k: {x: v[x] for x in ("wall_s", "server_starts", "parts_s", "busy_s",
                                                           "side_by_side_s", "overhead_s", "overhead_fraction")}
                                    for k, v in walls.items()}}


def _f(v, digits=1) -> str:
    return "—" if v is None else f"{v:+.{digits}f} %"


def markdown(got: dict) -> str:
    out = ["| Server | GPU | Cell | Measured beside | " + " | ".join(
        f"{label}: alone → beside (Δ{', Δ again' if got['again'] else ''})" for _, label in FIGURES) + " |",
        "|" + "---|" * (4 + len(FIGURES))]
    for r in got["cells"]:
        cells = []
        for col, _ in FIGURES:
            if r[f"{col}_alone"] is None:
                cells.append("—")
                continue
            again = f", {_f(r.get(f'{col}_again_delta_pct'))}" if got["again"] else ""
            cells.append(f"{r[f'{col}_alone']:,.1f} → {r[f'{col}_beside']:,.1f} ({_f(r[f'{col}_delta_pct'])}{again})")
        out.append(f"| {r['server_id']} | {r['server_gpus'] or '—'} | {r['cell_id']} | {r['ran_beside'] or '—'} | "
                   + " | ".join(cells) + " |")
    out += ["", "| Run | Wall | Server starts | Start-ups + windows, union | Overhead |", "|---|---|---|---|---|"]
    for name, w in got["runs"].items():
        busy = w["busy_s"] if w["busy_s"] is not None else None
        out.append(f"| {name} | {w['wall_s']:.0f} s | {w['server_starts']} | "
                   f"{'—' if busy is None else f'{busy:.0f} s'} | {w['overhead_s']:.0f} s "
                   f"({(w['overhead_fraction'] or 0) * 100:.1f} %) |")
    return "\n".join(out) + "\n"


def write(got: dict, out: Path) -> None:
    """``interference.md`` and ``interference.json`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "interference.md").write_text(markdown(got))
    (out / "interference.json").write_text(json.dumps(got, indent=2, default=str) + "\n")
