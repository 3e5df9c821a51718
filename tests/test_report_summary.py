"""The report gives the answer first: a summary before the run's detail (speedmatrix.report.document.summary_blocks),
built from a tracked run (docs/results/tiny-cpu-decisions) and from rows written for the test."""

import re

import pandas as pd

from conftest import REPO
from speedmatrix.core import fmt
from speedmatrix.core.table import html_page, markdown
from speedmatrix.history import regress
from speedmatrix.jobs import aggregate
from speedmatrix.judge import decide
from speedmatrix.plan import experiment
from speedmatrix.report import answer, charts, document, sections

RUN = REPO / "docs" / "results" / "tiny-cpu-decisions"


def test_the_summary_opens_the_report_and_answers_the_seeds_questions():
    m, d = aggregate.read_matrix(RUN / "matrix.parquet"), pd.read_parquet(RUN / "decisions.parquet")
    reqs = pd.read_parquet(RUN / "requests.parquet")
    plan = answer.Plan.of(experiment.load("tiny-cpu"))
    doc = document.blocks(m, [], {}, [], "tiny-cpu", "a description", decisions=d, requests=reqs, plan=plan)
    text = markdown(doc)
    h2 = re.findall(r"^## (.+)$", text, flags=re.M)
    assert h2[:3] == ["Summary", "Run", "Servers"]
    summary = text.split("## Summary", 1)[1].split("\n## ", 1)[0]
    h3 = re.findall(r"^### (.+)$", summary, flags=re.M)
    # the answer first: the verdict, where speculation pays, each config against the targets; then the rest
    assert h3[:3] == ["Where speculation pays", "Each config against the targets", "Best config per target"]
    verdict = summary.strip().split("\n\n", 1)[0]
    counts = m["status"].value_counts()
    assert f"In all: {len(m)} cells on 2 server configs" in summary
    assert all(f"{n} {label}" in summary for label, n in (("Valid", counts["valid"]),
                                                           ("Unstable", counts["unstable"])))
    assert f"Look at {int(m['status'].isin(['unstable', 'looped', 'lossy']).sum())} cells" in verdict
    # the best config per target, from the decisions, with its margin
    best = decide.best_configs(d)
    for r in best[(best["workload"] == "decode") & best["best_server"].notna()].itertuples():
        assert f"`{r.best_server}` at {fmt.ctx(int(r.context_tokens))} (c{int(r.concurrency)}, " in verdict
    # the speed-up matrix: a ratio inside its interval, the word the regression verdict gives, statuses not counted
    s = answer.speedups(m, reqs, plan)
    judged = s[s["ratio"].notna()]
    assert len(judged) >= 5 and ((judged["ci_low"] <= judged["ratio"]) & (judged["ratio"] <= judged["ci_high"])).all()
    assert set(s.loc[s["status_note"].notna(), "ratio"].isna()) == {True}
    table = summary.split("### Where speculation pays", 1)[1]
    for r in judged.itertuples():
        word = answer.WITHIN_NOISE if r.verdict in regress.NO_VERDICT else r.verdict
        assert f"×{r.ratio:.2f} ({r.ci_low:.2f}–{r.ci_high:.2f}) {word}" in table
    # the crossover named per context
    for ctx in sorted(s["context_tokens"].unique()):
        assert f"- At {fmt.ctx(int(ctx))}, `mtp2` " in table
    # every usable decode cell says which targets it meets; the best config's cells carry the star
    grid = summary.split("### Each config against the targets", 1)[1].split("###", 1)[0]
    assert "A = `interactive`, p90: TTFT ≤ 300 ms, TPOT ≤ 15 ms;" in grid
    stars = answer.best_cells(d, "decode")
    rows = "\n".join(r for r in grid.splitlines() if r.startswith("| `"))
    assert stars and rows.count("★") == len(stars)
    # speculation per config: the change over the decode cells both configs measured, with its sign
    both = sections.spec_versus_plain(m)
    row = next(r for r in summary.splitlines() if r.startswith("| `mtp2` | "))
    assert f"{both['change'].median():+.0%}" in row and f"| {len(both)} |" in row
    # the cells to look at: every Unstable cell, linked to its row in the detail below
    assert "### Cells to look at" in summary
    for r in m[m.status == "unstable"].itertuples():
        assert f"[{r.cell_id}](#{sections.cell_anchor(r.server_id, r.cell_id)})" in summary
    # the description moved under Run, the seed-shaped tables further down as they were
    assert text.index("a description") > text.index("## Run")
    assert "| Context | 1 | 4 | 16 | 64 |" in text.split("## Server config `base`", 1)[1]


def _judged(conc: int, ratio: float, verdict: str) -> dict:
    return {"server_id": "eagle3", "twin": "base", "cell_id": f"decode-ctx1024-c{conc}", "context_tokens": 1024,
            "concurrency": conc, "sampling": "greedy", "figure": "served_tok_s", "ratio": ratio,
            "ci_low": ratio - 0.02, "ci_high": ratio + 0.02, "verdict": verdict, "reason": "", "status_note": None}


def test_the_crossover_is_named_where_speculation_stops_paying():
    rows = [_judged(1, 1.8, "faster"), _judged(2, 1.5, "faster"), _judged(8, 1.1, "faster"),
            _judged(16, 1.01, "no change"), _judged(32, 0.85, "slower"), _judged(64, 0.69, "slower"),
            {**_judged(128, float("nan"), ""), "ratio": None, "verdict": None, "status_note": "Over capacity"}]
    s = pd.DataFrame(rows)
    line = answer.crossover_lines(s)[0]
    assert line.startswith("At 1K, `eagle3` pays at 1, 2 and 8 at once (up to +80 %)")
    assert "within noise at 16" in line and "costs at 32 and 64 (up to -31 %)" in line
    assert "crosses over between 8 and 32 at once" in line and "not counted at 128 (Over capacity)" in line
    # one verdict for the whole config, the not counted cell said apart
    assert answer.speculation_sentence(s) == ("Speculation: `eagle3` against `base`: faster in 3, slower in 2, "
                                              "within noise in 1 of 6 cells (×0.69 to ×1.80 output tok/s), "
                                              "1 not counted.")
    table = answer.speedup_table(s)
    assert table.rows[0][1] == "×1.80 (1.78–1.82) faster" and table.rows[0][-1] == "Over capacity"
    assert table.rows[0][4] == "×1.01 (0.99–1.03) within noise"


def test_the_trade_off_chart_draws_a_line_per_config_through_its_concurrencies():
    m = aggregate.read_matrix(RUN / "matrix.parquet")
    d = charts.pareto_data(m)
    assert not d["status"].isin(["looped", "lossy"]).any()
    spec = charts.pareto(d).to_dict()
    marks = [layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"] for layer in spec["layer"]]
    assert marks.count("line") == 2 and "text" in marks  # the frontier, the configs' lines, the concurrencies
    lines = next(layer for layer in spec["layer"][1:] if layer["mark"]["type"] == "line")
    assert lines["encoding"]["detail"]["field"] == "line" and lines["encoding"]["order"]["field"] == "concurrency"
    assert lines["encoding"]["x"]["title"] == "output tok/s per user"


def test_a_cell_to_look_at_links_to_its_row_on_the_page():
    m = pd.DataFrame([
        {"server_id": "a", "cell_id": "decode-ctx128-c4", "workload": "decode", "context_tokens": 128,
         "concurrency": 4, "status": "client_bound", "status_reason": "the client stood still 2.0 s"},
        {"server_id": "a", "cell_id": "decode-ctx128-c1", "workload": "decode", "context_tokens": 128,
         "concurrency": 1, "status": "valid", "status_reason": None},
    ])
    table = sections.needs_a_look_table(m)
    assert len(table) == 1 and table.rows[0][2] == "Client-bound"
    anchor = sections.cell_anchor("a", "decode-ctx128-c4")
    page = html_page([table], "t", statuses={"Client-bound": "client_bound"})
    assert f'<a href="#{anchor}">decode-ctx128-c4</a>' in page
    # the row it links to carries the anchor (the config's "All measurements" table)
    from speedmatrix.core.table import Table

    rows = Table(["Cell"])
    rows.add("decode-ctx128-c4", anchor=anchor)
    assert f'<tr id="{anchor}">' in html_page([rows], "t")
