"""Compare two runs cell by cell: ``speedmatrix compare RUN_A RUN_B`` (seed 003's matched comparison).

A run is a results directory (``results/<experiment>``), its ``matrix.parquet``, or a stored run's id. Cells are
matched on server config and cell id, or on the cell id alone with ``--match cell`` (one server config each side,
or the ones named by ``--server-a`` / ``--server-b``): the same workload, context, concurrency, sharing and corpus
on both sides. Each figure is judged as ``speedmatrix regress`` judges it (``history.regress.judge_cell``: the same
figures from the cells' requests, the same change, interval and verdict, B against A; the two runs alone, no
run-to-run noise from a store), and the exit status is regress's. Beside them, the matrix's own figures of each
cell (output tok/s over the window, goodput), under their own names, shown and not judged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

from .. import workloads
from ..core import atomic, fmt
from ..core.errors import NoCellInCommon
from ..core.runfolder import RunFolder
from ..core.status import USABLE, Status
from ..core.table import Block, Figure, Heading, Para, Table, markdown
from ..history import regress as rg
from ..history import store
from ..jobs import aggregate
from ..judge import decide
from . import charts, document, regression, sections

# the matrix's figures of a cell, shown beside the verdicts under names regress does not use (never judged)
FIGURES = [("total_tok_s", "output tok/s over the window", fmt.num),
           # the goodput under each run's first latency target (a run without targets: —)
           ("goodput_tok_s", "goodput tok/s", fmt.num)]
KEEP = ["server_id", "cell_id", "workload", "context_tokens", "concurrency", "status", "experiment", "delivery",
        *(f for f, _, _ in FIGURES)]


def load_matrix(run: str | Path) -> pd.DataFrame:
    path = Path(run)
    if path.is_dir():
        path = RunFolder(path).matrix
    if not path.exists():
        raise FileNotFoundError(f"{run}: no matrix.parquet (give a results directory of a finished run, "
                                "e.g. results/<experiment>, the matrix.parquet itself, or a stored run's id)")
    return aggregate.read_matrix(path)


def load_side(ref: str | Path, history: str | Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A run's matrix and requests: a results folder (or its matrix.parquet) as it is, else a run id (a unique start
    of one, a tag, or ``latest``) in the store ``history``."""
    path = Path(ref)
    if path.exists() or not history or not Path(history).exists():
        return load_matrix(path), store.requests_of(_run_dir(path))
    return regression.side(ref, history)[1:]  # a stored run, as regress reads it


def matched(a: pd.DataFrame, b: pd.DataFrame, match: str = "server", server_a: str | None = None,
            server_b: str | None = None) -> pd.DataFrame:
    """One row per cell present on both sides, A's and B's matrix rows side by side (each side's server config in
    ``server_id_a`` / ``server_id_b``; ``server_id`` names the pair)."""
    a, b = (m.assign(**{f: None for f in KEEP if f not in m}) for m in (a, b))  # an older run
    if server_a:
        a = a[a["server_id"] == server_a]
    if server_b:
        b = b[b["server_id"] == server_b]
    if match == "cell":
        for side, m in (("A", a), ("B", b)):
            if m["server_id"].nunique() > 1:
                raise ValueError(f"run {side} has several server configs ({', '.join(sorted(m.server_id.unique()))});"
                                 f" name one with --server-{side.lower()}")
        on = ["cell_id"]
    else:
        on = ["server_id", "cell_id"]
    both = a[KEEP].merge(b[KEEP], on=on, suffixes=("_a", "_b"))
    if both.empty:
        raise NoCellInCommon("the two runs have no cell in common (try --match cell with --server-a/--server-b)")
    for col in ("workload", "context_tokens", "concurrency"):
        both[col] = both[f"{col}_a"]
    if "server_id" in both:
        both["server_id_a"] = both["server_id_b"] = both["server_id"]
    else:
        both["server_id"] = both["server_id_a"] + " → " + both["server_id_b"]
    return both.sort_values(["server_id", "workload", "context_tokens", "concurrency"])


def judged(both: pd.DataFrame, reqs_a: pd.DataFrame, reqs_b: pd.DataFrame,
           min_effect: float | dict[str, float] | None = None, noise_multiple: float = 2.0) -> pd.DataFrame:
    """regress's verdict rows for the matched cells, B against A (``history.regress.judge_cell``): a cell A
    measured with a figure and B did not is lost, one Client-bound on either side a measurement problem."""
    on = ["server_id", "cell_id"]
    by_a, by_b = ({k: g for k, g in r.groupby(on)} for r in (reqs_a, reqs_b))
    rows: list[dict[str, Any]] = []
    for _, r in both.iterrows():
        ident = {"server_id": r["server_id"], "cell_id": r["cell_id"], "workload": r["workload"]}
        a, b = (pd.Series({"status": r[f"status_{s}"], "workload": r["workload"], "delivery": r[f"delivery_{s}"]})
                for s in ("a", "b"))
        why = rg.unmeasured(a, b, ("A", "B"))
        if why:
            rows.append(rg.not_judged(ident, a, b, why, paired=True))
            continue
        ra = by_a.get((r["server_id_a"], r["cell_id"]), reqs_a.iloc[:0])
        rb = by_b.get((r["server_id_b"], r["cell_id"]), reqs_b.iloc[:0])
        rows += rg.judge_cell(ident, a, b, rg.counted(ra), rg.counted(rb), min_effect, noise_multiple)
    return rg.ordered(rows)


def shown(value, status: str, show) -> str:
    """A figure where the cell has one (an unstable one marked), else its status."""
    if status == Status.VALID:
        return show(value)
    return f"{show(value)} (Unstable)" if status == Status.UNSTABLE else fmt.status(status)


def cell_name(r: Any) -> str:
    kind = workloads.get(r.workload)
    cell = f"{r.workload} {fmt.ctx(int(r.context_tokens))}" + ("" if kind.one_at_a_time else f" c{int(r.concurrency)}")
    if "-share" in str(r.cell_id):  # prefix-cache cells differ by their shared part
        cell += f" {str(r.cell_id).split('-share')[1].split('-')[0]}% shared"
    return cell


def table(both: pd.DataFrame) -> Table:
    """The matrix's own figures of each matched cell, A and B with B's change (not judged)."""
    heads = ["Server config", "Cell"]
    for _, name, _ in FIGURES:
        heads += [f"{name} A", f"{name} B", "Δ"]
    t = Table(heads)
    for r in both.itertuples():
        vals = [str(r.server_id), cell_name(r)]
        for col, _, show in FIGURES:
            va, vb = getattr(r, f"{col}_a"), getattr(r, f"{col}_b")
            sa, sb = r.status_a, r.status_b
            vals += [shown(va, sa, show), shown(vb, sb, show),
                     fmt.delta(va, vb) if sa in USABLE and sb in USABLE else "—"]
        t.add(*vals)
    return t


def chart(verdicts: pd.DataFrame) -> alt.Chart:
    """Each judged figure's change, B against A, with its 95 % interval: a point and a bar per cell and figure."""
    d = verdicts[verdicts["figure"].notna()].copy() if "change" in verdicts else verdicts.iloc[:0]
    if "change" in d:
        d = d[d["change"].notna()]
    d = pd.DataFrame({"cell": d.get("server_id", pd.Series(dtype=str)).astype(str) + " " + d.get(
        "cell_id", pd.Series(dtype=str)).astype(str), "figure": d.get("figure", pd.Series(dtype=str)).map(
        regression.LABEL), "change": d.get("change"), "low": d.get("ci_low"), "high": d.get("ci_high"),
        "verdict": d.get("verdict")})
    y = alt.Y("cell:N", title=None)
    bars = alt.Chart(d).mark_rule().encode(y=y, yOffset="figure:N", x=alt.X("low:Q", title="change, B against A",
                                                                              axis=alt.Axis(format="+%")),
                                           x2="high:Q", color=alt.Color("figure:N", title="figure"))
    dots = alt.Chart(d).mark_point(filled=True).encode(
        y=y, yOffset="figure:N", x="change:Q", color="figure:N", shape=alt.Shape("verdict:N"),
        tooltip=["cell", "figure", alt.Tooltip("change:Q", format="+.1%"), "verdict"])
    zero = alt.Chart(pd.DataFrame({"x": [0]})).mark_rule(color="#888").encode(x="x:Q")
    return alt.layer(zero, bars, dots).properties(width=480, title="Each judged figure's change with its 95 % "
                                                                   "interval")


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
            server_a: str | None = None, server_b: str | None = None, history: str | Path | None = None,
            min_effect: float | dict[str, float] | None = None,
            noise_multiple: float = 2.0) -> tuple[list[Block], pd.DataFrame]:
    """The comparison (its blocks, and regress's verdict rows for its exit status, JSON and JUnit); with
    ``out_dir`` also compare.md, compare.csv, compare.png and compare-report.html (one self-contained page: the
    verdicts, the matrix's figures, the chart and both runs' provenance)."""
    (ma, ra), (mb, rb) = load_side(run_a, history), load_side(run_b, history)
    both = matched(ma, mb, match, server_a, server_b)
    verdicts = judged(both, ra, rb, min_effect, noise_multiple)
    doc: list[Block] = [
        Heading(1, "Comparison"), Para(f"A = {run_a}; B = {run_b}. " + regression.answer(verdicts)),
        Para("Each figure judged as `speedmatrix regress` judges it, B against A, from the two runs alone: the "
             "cell's counted requests, the change's 95 % bootstrap interval, a verdict where the interval excludes "
             "no change and the change reaches the minimum effect (the user's, or twice the cell's own noise); "
             "latency figures only where both runs' tokens streamed as made; a tail percentile only where each side "
             "has the requests its interval needs."),
        *regression.verdict_blocks(verdicts, ("A", "B")),
        Heading(2, "The matrix's figures"),
        Para("Each cell's own figures as its run's matrix has them (output tok/s: every output token of the window "
             "over the window; goodput under each run's first latency target), A and B with B's change: shown, not "
             "judged."), table(both)]
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        drawn = chart(verdicts)
        charts.save_png(drawn, out / "compare.png")
        page = [*doc, Figure("Each judged figure's change", drawn.to_dict(), "compare.png",
                             "Each cell in both runs: the change of each judged figure, B against A, a bar for its "
                             "95 % interval (latencies: a negative change is faster)."),
                Heading(2, "Provenance"), provenance_table({"A": run_a, "B": run_b}, {"A": ma, "B": mb})]
        atomic.write_bytes(out / "compare.md", markdown(page).encode())
        atomic.write_bytes(out / "compare.csv", verdicts.to_csv(index=False).encode())
        atomic.write_bytes(out / "compare-report.html", document.page(page, "Comparison").encode())
    return doc, verdicts


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
