"""Compare two runs cell by cell: ``speedmatrix compare RUN_A RUN_B`` (seed 003's matched comparison).

A run is a results directory (``results/<experiment>``) or its
``matrix.parquet``. Cells are matched on server config and cell id, or on
the cell id alone with ``--match cell`` (one server config each side, or the
ones named by ``--server-a`` / ``--server-b``): the same workload, context,
concurrency, sharing and corpus on both sides. Each figure is shown for A and
B with B's change against A.
"""

from __future__ import annotations

from pathlib import Path

import altair as alt
import pandas as pd

from .. import workloads
from ..core import atomic, fmt
from ..core.errors import NoCellInCommon
from ..core.runfolder import RunFolder
from ..core.status import USABLE, Status
from ..core.table import Figure, Heading, Para, Table, markdown
from ..jobs import aggregate
from ..judge import decide
from . import charts, document, sections

FIGURES = [("total_tok_s", "output tok/s", fmt.num), ("ttft_ms", "median TTFT", fmt.ms),
           ("p95_ttft_ms", "p95 TTFT", fmt.ms),
           # the goodput under each run's first latency target (a run without targets: —)
           ("goodput_tok_s", "goodput tok/s", fmt.num)]


def load_matrix(run: str | Path) -> pd.DataFrame:
    path = Path(run)
    if path.is_dir():
        path = RunFolder(path).matrix
    if not path.exists():
        raise FileNotFoundError(f"{run}: no matrix.parquet (give a results directory of a finished run, "
                                "e.g. results/<experiment>, or the matrix.parquet itself)")
    return aggregate.read_matrix(path)


def matched(a: pd.DataFrame, b: pd.DataFrame, match: str = "server", server_a: str | None = None,
            server_b: str | None = None) -> pd.DataFrame:
    """One row per cell present on both sides, A's and B's figures side by side."""
    a, b = (m.assign(**{f: None for f, _, _ in FIGURES if f not in m}) for m in (a, b))  # an older run
    if server_a:
        a = a[a["server_id"] == server_a]
    if server_b:
        b = b[b["server_id"] == server_b]
    keep = ["server_id", "cell_id", "workload", "context_tokens", "concurrency", "status", "experiment",
            *(f for f, _, _ in FIGURES)]
    if match == "cell":
        for side, m in (("A", a), ("B", b)):
            if m["server_id"].nunique() > 1:
                raise ValueError(f"run {side} has several server configs ({', '.join(sorted(m.server_id.unique()))});"
                                 f" name one with --server-{side.lower()}")
        on = ["cell_id"]
    else:
        on = ["server_id", "cell_id"]
    both = a[keep].merge(b[keep], on=on, suffixes=("_a", "_b"))
    if both.empty:
        raise NoCellInCommon("the two runs have no cell in common (try --match cell with --server-a/--server-b)")
    for col in ("workload", "context_tokens", "concurrency"):
        if f"{col}_a" in both:
            both[col] = both[f"{col}_a"]
    if "server_id" not in both:
        both["server_id"] = both["server_id_a"] + " → " + both["server_id_b"]
    return both.sort_values(["server_id", "workload", "context_tokens", "concurrency"])


def shown(value, status: str, show) -> str:
    """A figure where the cell has one (an unstable one marked), else its status."""
    if status == Status.VALID:
        return show(value)
    return f"{show(value)} (Unstable)" if status == Status.UNSTABLE else fmt.status(status)


def table(both: pd.DataFrame) -> Table:
    heads = ["Server config", "Cell"]
    for _, name, _ in FIGURES:
        heads += [f"{name} A", f"{name} B", "Δ"]
    t = Table(heads)
    for r in both.itertuples():
        kind = workloads.get(r.workload)
        cell = f"{r.workload} {fmt.ctx(int(r.context_tokens))}" + ("" if kind.one_at_a_time
                                                                    else f" c{int(r.concurrency)}")
        if "-share" in str(r.cell_id):  # prefix-cache cells differ by their shared part
            cell += f" {str(r.cell_id).split('-share')[1].split('-')[0]}% shared"
        vals = [str(r.server_id), cell]
        for col, _, show in FIGURES:
            va, vb = getattr(r, f"{col}_a"), getattr(r, f"{col}_b")
            sa, sb = r.status_a, r.status_b
            usable = USABLE  # unstable: a figure, with a wide spread (marked)
            vals += [shown(va, sa, show), shown(vb, sb, show),
                     fmt.delta(va, vb) if sa in usable and sb in usable else "—"]
        t.add(*vals)
    return t


def chart(both: pd.DataFrame, label_a: str, label_b: str) -> alt.Chart:
    rows = []
    for r in both.itertuples():
        cell = f"{r.server_id} {r.cell_id}"
        for side, label in (("a", label_a), ("b", label_b)):
            if getattr(r, f"status_{side}") == Status.VALID:
                rows.append({"cell": cell, "run": label, "tok_s": getattr(r, f"total_tok_s_{side}")})
    d = pd.DataFrame(rows, columns=["cell", "run", "tok_s"])
    return alt.Chart(d).mark_bar().encode(
        y=alt.Y("cell:N", title=None), x=alt.X("tok_s:Q", title="output tok/s"),
        color=alt.Color("run:N", title="run"), yOffset="run:N",
        tooltip=["cell", "run", "tok_s"],
    ).properties(width=480, title="Output tok/s, cell by cell")


def _run_dir(run: str | Path) -> Path:
    path = Path(run)
    return path.parent if path.suffix == ".parquet" else path


def _json(path: Path) -> dict:
    return atomic.read_json(path) if path.exists() else {}


def provenance_table(runs: dict[str, str | Path], matrices: dict[str, pd.DataFrame]) -> Table:
    """Each run's provenance side by side: runtime, vLLM, package set or image, models, hardware, when."""
    t = Table(["", *runs])
    locks = {k: _json(RunFolder(_run_dir(r)).runtime_lock) for k, r in runs.items()}
    models = {k: _json(RunFolder(_run_dir(r)).models_lock).get("models") or {} for k, r in runs.items()}

    def first(m: pd.DataFrame, col: str) -> str:
        vals = sorted({str(v) for v in m.get(col, pd.Series(dtype=str)).dropna()})
        return ", ".join(vals) if vals else "—"

    t.add("experiment", *(first(matrices[k], "experiment") for k in runs))
    t.add("vLLM", *(first(matrices[k], "vllm_version") for k in runs))
    t.add("runtime", *(f"`{locks[k].get('image_ref') or locks[k].get('runtime_ref')}`" if locks[k]
                       else f"`{first(matrices[k], 'runtime_ref')}`" for k in runs))
    t.add("package set sha256", *(str(locks[k].get("packages_sha256") or "—")[:16] for k in runs))
    t.add("models", *("; ".join(f"{n}: {m.get('repo', m.get('preset', ''))} {str(m.get('revision', ''))[:12]}".strip()
                                for n, m in models[k].items()) or "—" for k in runs))
    t.add("hardware", *(first(matrices[k], "hostname") + " · " + first(matrices[k], "gpu_name") for k in runs))
    def when(m: pd.DataFrame) -> str:
        t = sorted(str(v) for v in m.get("started_at", pd.Series(dtype=str)).dropna())
        return f"{t[0]} to {t[-1]}" if t else "—"

    t.add("measured", *(when(matrices[k]) for k in runs))
    return t


def compare(run_a: str, run_b: str, out_dir: str | None = None, match: str = "server",
            server_a: str | None = None, server_b: str | None = None) -> str:
    """The comparison table (markdown); with ``out_dir`` also compare.md, compare.png and compare-report.html
    (one self-contained page: the table, the interactive chart and both runs' provenance)."""
    ma, mb = load_matrix(run_a), load_matrix(run_b)
    both = matched(ma, mb, match, server_a, server_b)
    doc = [Heading(1, "Comparison"),
           Para(f"A = {run_a}; B = {run_b}. Δ is B against A (for TTFT, negative is faster)."), table(both)]
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        drawn = chart(both, "A", "B")
        charts.save_png(drawn, out / "compare.png")
        page = [*doc, Figure("Output tok/s", drawn.to_dict(), "compare.png",
                             "Each cell present in both runs: A's and B's output tok/s (valid cells only)."),
                Heading(2, "Provenance"), provenance_table({"A": run_a, "B": run_b}, {"A": ma, "B": mb})]
        atomic.write_bytes(out / "compare.md", markdown(page).encode())
        atomic.write_bytes(out / "compare-report.html", document.page(page, "Comparison").encode())
    return markdown(doc)





def run_name(run: str | Path) -> str:
    path = Path(run)
    return (path.parent if path.suffix == ".parquet" else path).name


def pareto(runs: list[str], out_dir: str | None = None) -> str:
    """The Pareto frontier over the cells of several runs (tok/s per user against tok/s per GPU); markdown,
    and with ``out_dir`` pareto.md, pareto-report.html (the page, with the chart) and pareto.png."""
    names = [run_name(r) for r in runs]
    if len(set(names)) != len(names):
        names = [str(r) for r in runs]
    points = pd.concat([decide.pareto_points(load_matrix(r), name) for r, name in zip(runs, names)],
                       ignore_index=True)
    if points.empty:
        raise ValueError("no valid capacity or decode cell in these runs: nothing to draw a frontier from")
    points = decide.frontier(points)
    per = decide.per_unit(points)
    on = points[points["on_frontier"]]
    doc = [Heading(1, "Pareto frontier"),
           Para(f"Runs: {', '.join(names)}. Output tok/s per user against output tok/s per {per}, over every valid "
                f"capacity and decode cell; {len(on)} of {len(points)} cells are on the frontier."),
           sections.pareto_table(points, per)]
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        drawn = charts.pareto(charts.pareto_data_from_points(points))
        charts.save_png(drawn, out / "pareto.png")
        page = [*doc, Figure("Pareto frontier", drawn.to_dict(), "pareto.png",
                             "Every valid capacity and decode cell of the runs; the dashed line joins the frontier.")]
        atomic.write_bytes(out / "pareto.md", markdown(page).encode())
        atomic.write_bytes(out / "pareto-report.html", document.page(page, "Pareto frontier").encode())
    return markdown(doc)
