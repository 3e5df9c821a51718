"""The regression verdict and a cell's history as a document: ``speedmatrix regress`` and ``speedmatrix history``
print these, and a run's report carries them ("Against run X", "This cell in earlier runs")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ..core import atomic, fmt
from ..core.table import Block, Bullets, Heading, Para, Table, markdown
from ..history import regress as rg
from ..history import store
from . import document

SHOW = {"request_tok_s": fmt.num, "ttft_ms": fmt.ms, "tpot_ms": fmt.ms}
LABEL = {f.name: f.label for f in rg.FIGURES}


def _run_line(row: dict[str, Any]) -> str:
    parts = [f"`{row['run_id']}`", str(row.get("experiment")), f"vLLM {row.get('vllm_version')}",
             str(row.get("runtime_ref") or "")]
    where = ", ".join(str(x) for x in (row.get("hostname"), row.get("gpu_name") or row.get("cpu_model")) if x)
    return " · ".join(p for p in parts if p) + (f" · {where}" if where else "") + (
        f" · started {row['started_at']}" if row.get("started_at") else "") + (
        f" · {row['status']}" if row.get("status") != "complete" else "")


def counts(table: pd.DataFrame) -> dict[str, int]:
    per_cell = rg.cell_verdicts(table)["verdict"].value_counts()
    return {v: int(per_cell.get(v, 0)) for v in (rg.SLOWER, rg.FASTER, rg.SAME, rg.NOT_COMPARABLE)}


def answer(table: pd.DataFrame) -> str:
    c = counts(table)
    head = (f"**{c[rg.SLOWER]} cell{'s' * (c[rg.SLOWER] != 1)} slower**" if c[rg.SLOWER] else "**No cell slower**")
    return (f"{head}, {c[rg.FASTER]} faster, {c[rg.SAME]} with no change, {c[rg.NOT_COMPARABLE]} not comparable "
            "(per cell: slower if any figure is).")


def verdict_table(table: pd.DataFrame) -> Table:
    t = Table(["Server config", "Cell", "Figure", "Base", "New", "Change (95 % interval)", "Minimum effect",
               "Verdict", "Why"])
    for r in table.itertuples():
        fig = getattr(r, "figure", None)
        if not isinstance(fig, str):
            t.add(r.server_id, r.cell_id, "—", "—", "—", "—", "—", r.verdict, r.reason or "")
            continue
        show = SHOW[fig]
        measured = not fmt.missing(getattr(r, "change", None))
        change = (f"{r.change:+.1%} ({r.ci_low:+.1%} to {r.ci_high:+.1%})" if measured else "—")
        t.add(r.server_id, r.cell_id, LABEL[fig], show(getattr(r, "base", None)), show(getattr(r, "new", None)),
              change, fmt.pct(getattr(r, "min_effect", None)) if measured else "—", r.verdict, r.reason or "")
    return t


def blocks(table: pd.DataFrame, base: dict[str, Any], new: dict[str, Any], level: int = 1) -> list[Block]:
    return [Heading(level, f"Against run {base['run_id']}"), Para(answer(table)),
            Bullets([f"Base: {_run_line(base)}", f"New: {_run_line(new)}"]),
            Para("Each figure from the cell's requests (counted in its window, no error, no warm-up); the change's "
                 "95 % interval from a bootstrap over requests within each repeat; a verdict needs the interval to "
                 "exclude no change and the change to reach the minimum effect (the user's, or twice the cell's own "
                 "noise). Cells measured differently, or without a figure in either run, are not compared."),
            verdict_table(table)]


def write(out: str | Path, table: pd.DataFrame, base: dict[str, Any], new: dict[str, Any]) -> Path:
    """regress.md, regress.html and regress.csv (every figure's row) into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    doc = blocks(table, base, new)
    atomic.write_bytes(out / "regress.md", markdown(doc).encode())
    atomic.write_bytes(out / "regress.html", document.page(doc, f"Against run {base['run_id']}").encode())
    table.to_csv(out / "regress.csv", index=False)
    return out / "regress.md"


def runs_table(runs: pd.DataFrame) -> Table:
    t = Table(["Run", "Experiment", "Started", "Status", "Cells", "vLLM", "Runtime", "Host", "Commit"])
    for r in runs.itertuples():
        t.add(r.run_id, r.experiment, r.started_at or "—", r.status, r.cells, r.vllm_version or "—",
              r.runtime_ref or "—", r.hostname or "—", (r.speedmatrix_commit or "—")[:12])
    return t


CELL_FIGURES = [("total_tok_s", "output tok/s", fmt.num), ("ttft_ms", "median TTFT", fmt.ms),
                ("itl_ms", "median ITL", fmt.ms), ("spec_acceptance_rate", "acceptance", fmt.pct)]


def cell_table(history: pd.DataFrame) -> Table:
    """One cell across runs: each run's figures with their 95 % interval where the cell had repeats."""
    t = Table(["Run", "Started", "vLLM", "Status", *(name for _, name, _ in CELL_FIGURES)])
    for _, r in history.iterrows():
        vals = []
        for col, _, show in CELL_FIGURES:
            v = show(r.get(col))
            lo, hi = r.get(f"{col}_ci_low"), r.get(f"{col}_ci_high")
            vals.append(v if fmt.missing(lo) or fmt.missing(hi) else f"{v} ({show(lo)}–{show(hi)})")
        t.add(r["run_id"], r.get("run_started_at") or "—", r.get("run_vllm_version") or "—",
              fmt.status(r["status"]), *vals)
    return t


def history_text(store_path: Path, experiment: str | None, cell: str | None) -> str:
    if cell:
        server_id, _, cell_id = cell.partition("/")
        found = store.cell_history(store_path, server_id, cell_id, experiment)
        if found.empty:
            return f"{cell}: in no stored run" + (f" of {experiment}" if experiment else "")
        return markdown([Heading(1, f"{cell} in every stored run"), cell_table(found)])
    found = store.runs(store_path, experiment)
    return markdown([Heading(1, f"Runs in {store_path}"), runs_table(found)]) if len(found) else \
        f"{store_path}: no run stored" + (f" of {experiment}" if experiment else "")
