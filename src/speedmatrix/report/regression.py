"""The regression verdict and a cell's history as a document: ``speedmatrix regress`` and ``speedmatrix history``
print these, and a run's report carries them ("Against run X", "This cell in earlier runs")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

from ..core import atomic, fmt
from ..core.errors import StoreError
from ..core.runfolder import RunFolder
from ..core.table import Block, Bullets, Figure, Heading, Para, Table, html_page, markdown
from ..history import gate, store
from ..history import regress as rg
from . import charts

SHOW = {f.name: (fmt.num if f.higher_is_better else fmt.ms) for f in rg.FIGURES}
LABEL = {f.name: f.label for f in rg.FIGURES}


def _run_line(row: dict[str, Any]) -> str:
    parts = [f"`{row['run_id']}`", str(row.get("experiment")), f"vLLM {row.get('vllm_version')}",
             str(row.get("runtime_ref") or "")]
    where = ", ".join(str(x) for x in (row.get("hostname"), row.get("gpu_name") or row.get("cpu_model")) if x)
    return " · ".join(p for p in parts if p) + (f" · {where}" if where else "") + (
        f" · started {row['started_at']}" if row.get("started_at") else "") + (
        f" · {row['status']}" if row.get("status") != "complete" else "")


def counts(table: pd.DataFrame) -> dict[str, int]:
    """Per cell: its verdict (slower if any figure is), and how many cells were lost or not judged for a
    measurement problem (both among the not comparable)."""
    per_cell = rg.cell_verdicts(table)["verdict"].value_counts()
    out = {v: int(per_cell.get(v, 0)) for v in (rg.SLOWER, rg.FASTER, rg.INCONCLUSIVE, rg.SAME, rg.NOT_COMPARABLE)}
    return {**out, "lost": len(rg.lost_cells(table)), "measurement": len(rg.measurement_cells(table))}


def answer(table: pd.DataFrame, causes: list[str] | None = None) -> str:
    """The headline: every outcome with its count, and the exit status it gives. ``causes``: the new run's
    failed jobs' causes (its run summary), said where it lost cells."""
    c = counts(table)
    code = rg.outcome(table)
    if rg.nothing_compared(table):
        head = (f"**Nothing compared**: none of the {c[rg.NOT_COMPARABLE]} cells has a figure in both runs (the "
                "Why column says which run lacks it); no verdict")
    else:
        head = ((f"**{c[rg.SLOWER]} cell{'s' * (c[rg.SLOWER] != 1)} slower**" if c[rg.SLOWER]
                 else "**No cell slower**")
                + f", {c[rg.FASTER]} faster, {c[rg.SAME]} with no change, {c[rg.INCONCLUSIVE]} inconclusive")
    rest = [f"**{c['lost']} lost**" if c["lost"] else "0 lost",
            f"**{c['measurement']} not judged for a measurement problem** (a Client-bound cell or too few requests: "
            "not the server's)"
            if c["measurement"] else "0 with a measurement problem",
            f"{c[rg.NOT_COMPARABLE]} not comparable in all"]
    name = code.name.lower().replace("_", " ")
    said = f"{head}; {', '.join(rest)} (per cell: slower if any figure is). Outcome: {name} (exit {int(code)})."
    if c["lost"] and causes:
        said += " The new run's failed jobs: " + "; ".join(causes[:3]) + (" ..." if len(causes) > 3 else "") + "."
    change = table.attrs.get("machine_change")  # regress.withhold's
    if change:
        said = f"**Another kind of machine**: ({change}): --across-machines judges it anyway. " + said
    return said


def verdict_blocks(table: pd.DataFrame, sides: tuple[str, str] = ("Base", "New")) -> list[Block]:
    """Every figure's row, but those a reader need not see (regress.unshown: said in a line under the table,
    kept in the CSV and JSON)."""
    hidden = rg.unshown(table)
    t = Table(["Server config", "Cell", "Figure", *sides, "Change (95 % interval)", "Minimum effect",
               "Verdict", "Why"])
    for r in table[~hidden].itertuples():
        fig = getattr(r, "figure", None)
        if not isinstance(fig, str):
            t.add(r.server_id, r.cell_id, "—", "—", "—", "—", "—", r.verdict, r.reason or "")
            continue
        show = SHOW[fig]
        measured = not fmt.missing(getattr(r, "change", None))
        change = (f"{r.change:+.1%} ({r.ci_low:+.1%} to {r.ci_high:+.1%})" if measured else "—")
        t.add(r.server_id, r.cell_id, LABEL[fig], show(getattr(r, "base", None)), show(getattr(r, "new", None)),
              change, fmt.pct(getattr(r, "min_effect", None)) if measured else "—", r.verdict, r.reason or "")
    if not hidden.any():
        return [t]
    needs = ", ".join(f"p{f.q:g}: {f.min_requests()}" for f in rg.FIGURES if f.q is not None and "ttft" in f.name)
    return [t, Para(f"Not shown: {int(hidden.sum())} rows not comparable for want of the figure (one output token "
                    f"has no TPOT) or of the requests a tail percentile's interval needs ({needs}); the CSV and "
                    "JSON have every row.")]


def _joules(v: Any) -> str:
    return fmt.whole(v, "{:.4g} J")


# beside the verdict, each run's own figures (no interval, no verdict): what speculation accepted and what a token
# cost the GPU, where a run recorded them
BESIDE = (("spec_acceptance_rate", "acceptance", fmt.pct), ("total_tok_s", "output tok/s", fmt.num),
          ("gpu_energy_per_output_token_j", "energy per output token", _joules),
          ("gpu_energy_above_idle_per_output_token_j", "above idle", _joules),
          ("gpu_energy_per_goodput_token_j", "per goodput token", _joules))


def beside_table(base_cells: pd.DataFrame, new_cells: pd.DataFrame) -> Table | None:
    """Each cell both runs measured: its acceptance rate and energy per token in each run, side by side (None when
    neither run recorded any: no speculation, no GPU)."""
    if not len(base_cells) or not len(new_cells):
        return None
    both = base_cells.merge(new_cells, on=["server_id", "cell_id"], suffixes=("_base", "_new"))
    shown = [(col, label, show) for col, label, show in BESIDE
             if any(f"{col}_{s}" in both and both[f"{col}_{s}"].notna().any() for s in ("base", "new"))]
    if not any(col != "total_tok_s" for col, _, _ in shown):
        return None
    t = Table(["Server config", "Cell", *(f"{label} ({side})" for _, label, _ in shown for side in ("base", "new"))])
    for _, r in both.sort_values(["server_id", "cell_id"]).iterrows():
        t.add(r["server_id"], r["cell_id"], *(show(r.get(f"{col}_{side}")) for col, _, show in shown
                                              for side in ("base", "new")))
    return t


def blocks(table: pd.DataFrame, base: dict[str, Any], new: dict[str, Any], level: int = 1,
           cells: tuple[pd.DataFrame, pd.DataFrame] | None = None, causes: list[str] | None = None) -> list[Block]:
    beside = beside_table(*cells) if cells is not None else None
    extra: list[Block] = [] if beside is None else [
        Heading(level + 1, "Speculation and energy in each run"),
        Para("As each run recorded them, for the cells both measured: the server's speculative acceptance rate, "
             "output tok/s, the GPU energy per output token over the measurement window, its part above what the "
             "GPU drew idle before the server started, and the energy over only the tokens of requests that met "
             "the first latency target. Not judged: read them beside the verdicts above."), beside]
    return [Heading(level, f"Against run {base['run_id']}"), Para(answer(table, causes)),
            Bullets([f"Base: {_run_line(base)}", f"New: {_run_line(new)}",
                     *([f"Where: {where}"] if (where := rg.hosts(base, new)) else [])]),
            Para("Each figure from the cell's requests (counted in its window, no error, no warm-up); the change's "
                 "95 % interval from a bootstrap over requests within each repeat; a verdict needs the interval to "
                 "exclude no change and the change to reach the minimum effect (the user's, else the larger of twice "
                 "the cell's own noise, its repeats' spread and each run's interval, and the change one more run may "
                 "show by chance given the store's other runs of the same runtime on a machine of the same kind, "
                 "GPU, CPU model and core count, where there are some: Student's t over them times the square root "
                 "of 1 + 1/m, times their spread). No change only where the interval holds none and stays within "
                 "the minimum effect; a "
                 "change under it, or an interval reaching beyond it, is inconclusive. Latency figures only where "
                 "both runs' tokens streamed as made. Cells measured "
                 "differently, searches, and cells without a figure in either run are not compared."),
            *verdict_blocks(table), *extra]


def write(out: str | Path, table: pd.DataFrame, base: dict[str, Any], new: dict[str, Any],
          cells: tuple[pd.DataFrame, pd.DataFrame] | None = None, causes: list[str] | None = None) -> Path:
    """regress.md, regress.html and regress.csv (every figure's row) into ``out``; ``cells``: both runs' cells,
    for their acceptance and energy side by side."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    doc = blocks(table, base, new, cells=cells, causes=causes)
    atomic.write_bytes(out / "regress.md", markdown(doc).encode())
    atomic.write_bytes(out / "regress.html", html_page(doc, f"Against run {base['run_id']}").encode())
    table.to_csv(out / "regress.csv", index=False)
    return out / "regress.md"


def verdict_json(table: pd.DataFrame, base: dict[str, Any], new: dict[str, Any],
                 causes: list[str] | None = None) -> dict[str, Any]:
    """The verdict for a machine: the outcome, its exit status and meaning, the headline, the counts, the cells of
    each outcome found, both runs' ids and every figure's row."""
    code = rg.outcome(table)
    rows = json.loads(table.to_json(orient="records"))  # NaN as null
    return {"outcome": code.name.lower(), "exit_status": int(code), "meaning": gate.MEANING[code],
            "headline": answer(table, causes).replace("**", ""), "counts": counts(table),
            "found": {o.name.lower(): cells for o, cells in rg.found(table).items()},
            "base": base.get("run_id"), "new": new.get("run_id"), "new_run_causes": causes or [], "rows": rows}


def verdict_junit(table: pd.DataFrame, base: dict[str, Any], new: dict[str, Any], command: str = "regress") -> str:
    """The verdict as JUnit XML, for CI systems that read it: a test case per cell; a slower or lost cell is a
    failure, a measurement problem an error, a cell not comparable otherwise is skipped."""
    import xml.etree.ElementTree as ET

    per_cell = rg.cell_verdicts(table).set_index(["server_id", "cell_id"])["verdict"]
    lost, measured = set(rg.lost_cells(table)), set(rg.measurement_cells(table))
    suite = ET.Element("testsuite", name=f"speedmatrix {command} {base.get('run_id')} -> {new.get('run_id')}")
    failures = errors = skipped = 0
    for (sid, cid), verdict in per_cell.items():
        case = ET.SubElement(suite, "testcase", classname=str(sid), name=str(cid))
        rows = table[(table["server_id"] == sid) & (table["cell_id"] == cid)]
        why = "; ".join(dict.fromkeys(str(r) for r in rows["reason"].dropna() if r)) or verdict
        key = f"{sid}/{cid}"
        if key in lost or verdict == rg.SLOWER:
            failures += 1
            ET.SubElement(case, "failure", type="lost" if key in lost else "slower", message=why)
        elif key in measured:
            errors += 1
            ET.SubElement(case, "error", type="measurement", message=why)
        elif verdict == rg.NOT_COMPARABLE:
            skipped += 1
            ET.SubElement(case, "skipped", message=why)
    suite.set("tests", str(len(per_cell)))
    suite.set("failures", str(failures)), suite.set("errors", str(errors)), suite.set("skipped", str(skipped))
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def runs_table(runs: pd.DataFrame) -> Table:
    t = Table(["Run", "Tags", "Experiment", "Started", "Status", "Cells", "vLLM", "Runtime", "Host", "Host probe",
               "Commit"])
    for _, r in runs.iterrows():
        t.add(r["run_id"], r.get("tags") or "—", r["experiment"], r["started_at"] or "—", r["status"], r["cells"],
              r["vllm_version"] or "—", r["runtime_ref"] or "—", r["hostname"] or "—", fmt.ms(r.get("host_probe_ms")),
              (r["speedmatrix_commit"] or "—")[:12])
    return t


CELL_FIGURES = [("total_tok_s", "output tok/s", fmt.num), ("ttft_ms", "median TTFT", fmt.ms),
                ("tbt_ms", "median time between tokens", fmt.ms), ("spec_acceptance_rate", "acceptance", fmt.pct)]


def machine_of(row: dict[str, Any] | pd.Series) -> str:
    """A run's kind of machine as a reader names it: its GPU, else its CPU model and cores."""
    gpu = gpu_of(row)
    return gpu if gpu != "—" else cpu_of(row)


def gpu_of(row: dict[str, Any] | pd.Series) -> str:
    gpu = row.get("run_gpu_name", row.get("gpu_name"))
    return str(gpu) if not fmt.missing(gpu) and gpu else "—"


def cpu_of(row: dict[str, Any] | pd.Series) -> str:
    cpu, cores = row.get("run_cpu_model", row.get("cpu_model")), row.get("run_cpu_count", row.get("cpu_count"))
    return " x ".join(str(x) for x in (None if fmt.missing(cpu) else cpu, None if fmt.missing(cores)
                                       else int(cores)) if x is not None) or "—"


def cell_table(history: pd.DataFrame) -> Table:
    """Cells across runs (one cell, or a family of them): each run's experiment, runtime, GPU and CPU, and the
    cell's figures with their 95 % interval where it had repeats (a change of machine or experiment is in its row,
    not mistaken for a change of speed)."""
    many = history[["server_id", "cell_id"]].drop_duplicates().shape[0] > 1 if len(history) else False
    t = Table(["Run", "Started", "Experiment", "vLLM", "Runtime", "GPU", "CPU", *(["Server config", "Cell"] * many),
               "Status", *(name for _, name, _ in CELL_FIGURES)])
    for _, r in history.iterrows():
        vals = []
        for col, _, show in CELL_FIGURES:
            v = show(r.get(col))
            lo, hi = r.get(f"{col}_ci_low"), r.get(f"{col}_ci_high")
            vals.append(v if fmt.missing(lo) or fmt.missing(hi) else f"{v} ({show(lo)}–{show(hi)})")
        t.add(r["run_id"], r.get("run_started_at") or "—", r.get("run_experiment") or "—",
              r.get("run_vllm_version") or "—", r.get("run_runtime_ref") or "—", gpu_of(r), cpu_of(r),
              *([r["server_id"], r["cell_id"]] * many), fmt.status(r["status"]), *vals)
    return t


def select_history(history: pd.DataFrame, machine: str | None = None, same_config: bool = False) -> pd.DataFrame:
    """Cells' rows across runs narrowed for a trend: the runs on a machine whose name (GPU, or CPU model and cores)
    holds ``machine``, and with ``same_config`` each cell's runs whose server config (flags, environment, models:
    ``config_sha256``, not the experiment's name or the runtime) is its newest run's, so that an ``extends:`` child
    or another release of the same config lines up and a changed flag does not."""
    out = history
    if machine and len(out):
        out = out[[machine.lower() in machine_of(r).lower() for _, r in out.iterrows()]]
    if same_config and len(out) and "config_sha256" in out:
        newest = out.groupby(["server_id", "cell_id"])["config_sha256"].transform("last")
        out = out[out["config_sha256"] == newest]
    return out


def _trend_data(history: pd.DataFrame) -> pd.DataFrame:
    d = history.assign(started=pd.to_datetime(history["run_started_at"], errors="coerce", utc=True),
                       machine=[machine_of(r) for _, r in history.iterrows()],
                       runtime=history["run_runtime_ref"].fillna("—") if "run_runtime_ref" in history else "—")
    usable = d["status"].isin(rg.COMPARABLE_STATUSES) if "status" in d else True
    return d[d["total_tok_s"].notna() & usable]


def trend_chart(history: pd.DataFrame, cell: str) -> alt.Chart:
    """Across runs, oldest first: for one cell its output tok/s, a point per run coloured by runtime and shaped by
    machine; for a family of cells each cell's output tok/s over its median across the runs shown, a faint point per
    cell and a point per run at the cells' median. The run-to-run band (the median ± twice the standard deviation of
    what is plotted per run) shaded."""
    d = _trend_data(history)
    family = d[["server_id", "cell_id"]].drop_duplicates().shape[0] > 1
    if family:
        d = d.assign(value=d["total_tok_s"] / d.groupby(["server_id", "cell_id"])["total_tok_s"].transform("median"))
        per_run = d.groupby(["run_id", "started", "runtime", "machine", "run_experiment"], as_index=False,
                            dropna=False)["value"].median()
        title, axis = f"{cell}: each cell's output tok/s over its median across runs", "output tok/s / cell median"
    else:
        d = d.assign(value=d["total_tok_s"])
        per_run = d
        title, axis = f"{cell}: output tok/s across runs", "output tok/s"
    v = per_run["value"]
    mid, sd = float(v.median()) if len(v) else 0.0, float(v.std(ddof=1)) if len(v) > 1 else 0.0
    x = alt.X("utcyearmonthdatehoursminutes(started):T", title="run started (UTC)",
              axis=alt.Axis(format="%Y-%m-%d %H:%M", labelAngle=-30))
    band = alt.Chart(pd.DataFrame({"low": [mid - 2 * sd], "high": [mid + 2 * sd]})).mark_rect(
        opacity=0.15, color="gray").encode(y="low:Q", y2="high:Q")
    line = alt.Chart(per_run).mark_line(color="#888").encode(x=x, y=alt.Y("value:Q", title=axis,
                                                                           scale=alt.Scale(zero=False)))
    dots = alt.Chart(per_run).mark_point(filled=True, size=70).encode(
        x=x, y="value:Q", color=alt.Color("runtime:N"), shape=alt.Shape("machine:N"),
        tooltip=["run_id", "run_experiment", "runtime", "machine", alt.Tooltip("value:Q", format=".4g")])
    layers = [band, line, dots]
    if family:
        layers.insert(1, alt.Chart(d).mark_point(size=12, opacity=0.35, color="#666").encode(
            x=x, y="value:Q", tooltip=["run_id", "server_id", "cell_id", alt.Tooltip("value:Q", format=".3f")]))
    return alt.layer(*layers).properties(
        width=560, height=280, title=f"{title} (band: median ± 2 SD of the runs shown)")


def history_text(store_path: Path, experiment: str | None) -> str:
    """The stored runs (of one experiment), oldest first, as markdown."""
    found = store.runs(store_path, experiment)
    return markdown([Heading(1, f"Runs in {store_path}"), runs_table(found)]) if len(found) else \
        f"{store_path}: no run stored" + (f" of {experiment}" if experiment else "")


def _st(s: Any) -> str:
    return "—" if fmt.missing(s) else fmt.status(s)


def _named_table(named: pd.DataFrame) -> Table:
    t = Table(["Server config", "GPU", "Context", "Concurrency", "Published tok/s", "Run tok/s", "Run / published",
               "Published p95 TTFT", "Run p95 TTFT", "Run status"])
    for r in named.itertuples():
        t.add(r.server_id, getattr(r, "gpu", "—"), fmt.ctx(int(r.context)), int(r.concurrency),
              fmt.num(r.total_tok_s_published), fmt.num(r.total_tok_s), fmt.whole(r.total_tok_s_ratio, "{:.3f}×"),
              fmt.ms(getattr(r, "p95_ttft_ms_published", None)), fmt.ms(getattr(r, "p95_ttft_ms", None)),
              _st(r.status))
    return t


def reproduction_blocks(found: dict[str, Any], level: int = 1) -> list[Block]:
    """The reproduction verdict: the answer first (status agreement, boundary), then the tables."""
    s = found["summary"]
    cells, rows, prefill, named = found["cells"], found["rows"], found["prefill"], found.get("named", pd.DataFrame())
    pct = s["agree"] / s["measured"] if s["measured"] else None
    source = f"Published: `{s['published']}` ({s['source']})."
    out: list[Block] = [Heading(level, "Against the published matrix")]
    if len(named):
        out += [Para(f"**{s['named_measured']} of {s['named']} published figures have a cell of the same server "
                     f"config, context and concurrency in this run.** {source}"), _named_table(named)]
    if cells.empty:
        return out
    out += [
        Para(f"**Status agreement: {s['agree']} of {s['measured']} sustained-decode cells ({fmt.pct(pct)}); the "
             f"over-capacity boundary falls at the same concurrency in {s['same_boundary']} of {s['rows']} context "
             f"rows.** {source}"),
        Para("Rows are matched in context order (the run's i-th context with the published i-th), concurrency by "
             "value. KV multiple: the context x concurrency a cell needs over the run's KV cache, so a run with "
             "smaller contexts or another GPU is compared on its shape; the published KV cache was not given.")]
    bt = Table(["Published context", "Run context", "Published: first over capacity", "Run: first over capacity",
                "Run: KV multiple there", "Run: largest KV multiple that fit", "Same"])
    for r in rows.itertuples():
        bt.add(fmt.ctx(r.published_context), "—" if fmt.missing(r.run_context) else fmt.ctx(int(r.run_context)),
               "none" if fmt.missing(r.published_first_over) else f"c{int(r.published_first_over)}",
               "none" if fmt.missing(r.run_first_over) else f"c{int(r.run_first_over)}",
               fmt.whole(r.run_kv_multiple_first_over, "{:.2f}×"), fmt.whole(r.run_kv_multiple_largest_fit,
                                                                                 "{:.2f}×"),
               "yes" if r.same_boundary else "no")
    out += [Heading(level + 1, "Over-capacity boundary, row by row"), bt]
    ct = Table(["Published context", "Concurrency", "Published", "Run", "Agree", "Run tok/s", "Published tok/s",
                "Run / published"])
    for r in cells.itertuples():
        ct.add(fmt.ctx(r.context), int(r.concurrency), _st(r.status_published), _st(r.status_run),
               "yes" if r.agree else "no", fmt.num(getattr(r, "total_tok_s", None)),
               fmt.num(getattr(r, "total_tok_s_published", None)),
               fmt.whole(getattr(r, "total_tok_s_ratio", None), "{:.3f}×"))
    out += [Heading(level + 1, "Sustained decode, cell by cell"), ct]
    if len(prefill):
        pt = Table(["Published context", "Run context", "Run prompt tok/s", "Published", "Run / published",
                    "Run TTFT", "Published TTFT"])
        for r in prefill.itertuples():
            pt.add(fmt.ctx(int(r.context)), "—" if fmt.missing(r.context_tokens) else fmt.ctx(int(r.context_tokens)),
                   fmt.num(r.prompt_tok_s), fmt.num(r.prompt_tok_s_published),
                   fmt.whole(r.prompt_tok_s_ratio, "{:.3f}×"), fmt.ms(r.ttft_ms), fmt.ms(r.ttft_ms_published))
        out += [Heading(level + 1, "Prefill, row by row"), pt]
    return out


def earlier_rows(history_path: str | Path, results_dir: Path) -> tuple[str, pd.DataFrame]:
    """This run's id and the earlier stored rows of its cells: its family (``store.family``: the same server, cell
    and server config in any run) on a machine of this run's kind, this run left out, oldest first."""
    this, keys, machine = store.folder_keys(results_dir)
    rows = store.family(history_path, keys=keys)
    if rows.empty:
        return this, rows
    return this, rows[rg.of_kind(rows, rg.machine_kind(machine), "run_") & (rows["run_id"] != this)]


EARLIER = 4  # earlier runs a report shows beside its own


def earlier_runs_blocks(history_path: str | Path, experiment: str, results_dir: Path, matrix: pd.DataFrame,
                        out: dict[str, str]) -> list[Block]:
    """This run's cells in the stored runs of its family before it (the latest EARLIER): output tok/s of each cell
    in each, a table and a chart of each as a ratio to this run."""
    this, rows = earlier_rows(history_path, results_dir)
    if rows.empty:
        return []
    runs = (rows.drop_duplicates("run_id")[["run_id", "run_started_at", "run_vllm_version", "run_experiment"]]
            .rename(columns={"run_started_at": "started_at", "run_vllm_version": "vllm_version"}).tail(EARLIER))
    now = matrix.set_index(["server_id", "cell_id"])
    cols = {rid: g.set_index(["server_id", "cell_id"]) for rid, g in rows[rows["run_id"].isin(runs["run_id"])]
            .groupby("run_id", sort=False)}
    t = Table(["Server config", "Cell", "This run", *(f"{r.run_id} ({r.run_experiment}, {str(r.started_at)[:10]}, "
                                                        f"vLLM {r.vllm_version})" for r in runs.itertuples())])
    points = []
    shown = lambda row: (fmt.num(row["total_tok_s"]) if row["status"] in rg.COMPARABLE_STATUSES  # noqa: E731
                         else fmt.status(row["status"]))
    for key, row in now.iterrows():
        vals = []
        for rid, cells in cols.items():
            if key in cells.index:
                old = cells.loc[key]
                vals.append(shown(old))
                if (old["status"] in rg.COMPARABLE_STATUSES and row["status"] in rg.COMPARABLE_STATUSES
                        and row["total_tok_s"]):
                    points.append({"cell": f"{key[0]} {key[1]}", "run": rid,
                                   "ratio": float(old["total_tok_s"]) / float(row["total_tok_s"])})
            else:
                vals.append("—")
        t.add(key[0], key[1], shown(row), *vals)
    blocks_: list[Block] = [Heading(2, "This run's cells in earlier runs"),
                            Para(f"Output tok/s of each cell in the latest {len(runs)} earlier stored runs that "
                                 "measured it with the same server config (flags, environment, models) on a "
                                 f"machine of this run's kind, whatever their experiment or release: "
                                 f"`speedmatrix history --trend {experiment} --same-config` selects the same; "
                                 f"`speedmatrix regress RUN {this}` judges a change with its statistics."), t]
    if points:
        data = pd.DataFrame(points)
        chart = alt.Chart(data).mark_point(filled=True).encode(
            x=alt.X("ratio:Q", title="earlier run's output tok/s over this run's", scale=alt.Scale(zero=False)),
            y=alt.Y("cell:N", title=None), color=alt.Color("run:N", title="earlier run"),
            tooltip=["cell", "run", alt.Tooltip("ratio:Q", format=".3f")]).properties(
            width=420, title="Each cell in earlier runs, against this run")
        png = RunFolder(Path(out["md"]).parent).chart("earlier_runs")
        png.parent.mkdir(parents=True, exist_ok=True)
        charts.save_png(chart, png)
        blocks_.append(Figure("Each cell in earlier runs, against this run", chart.to_dict(),
                              str(png.relative_to(Path(out["md"]).parent)),
                              "1.0: the same output tok/s as this run; each point a cell in one earlier run."))
    return blocks_


def side(ref: str | Path, history_path: str | Path | None) -> tuple[dict[str, Any], pd.DataFrame, pd.DataFrame]:
    """A run for a verdict: a results folder (read as it is) or a run id in the store (a unique start of one)."""
    if Path(ref).is_dir():
        return store.manifest(ref)
    if not history_path:
        raise StoreError(f"{ref}: not a results folder, and no results store to look the id up in")
    run_id = store.resolve(history_path, str(ref))
    row = store.runs(history_path).set_index("run_id").loc[run_id].to_dict() | {"run_id": run_id}
    return row, store.cells(history_path, run_id), store.requests(history_path, run_id)


def siblings(history_path: str | Path | None, base: dict[str, Any], new: dict[str, Any]) -> tuple[list, list]:
    """The store's other runs of BASE's runtime and of NEW's on a machine of the same kind (their cells and
    requests): each cell's run-to-run spread for the minimum effect. A run of the runtime on another kind of
    machine (another GPU, CPU model or core count) is left out: its difference is the machine's, not noise."""
    out: tuple[list, list] = ([], [])
    if not history_path or not Path(history_path).exists():
        return out
    stored = store.runs(history_path)
    for found, row in zip(out, (base, new)):
        same = stored[(stored["runtime_ref"] == row.get("runtime_ref"))
                      & ~stored["run_id"].isin([base["run_id"], new["run_id"]])
                      & rg.of_kind(stored, rg.machine_kind(row))]
        found += [(store.cells(history_path, rid), store.requests(history_path, rid)) for rid in same["run_id"]]
    return out


def against_blocks(ref: str, history_path: str | Path | None, results_dir: Path) -> list[Block]:
    """The report's section "Against run X": this run judged against the one the config's ``against`` names."""
    base, bc, br = side(ref, history_path)
    new, nc, nr = store.manifest(results_dir)
    table = rg.regress(bc, br, nc, nr, siblings=siblings(history_path, base, new))
    return blocks(table, base, new, level=2, cells=(bc, nc))
