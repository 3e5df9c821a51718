"""The report gives the answer first: a summary before the run's detail (speedmatrix.report.document.summary_blocks),
built from a tracked run (docs/results/tiny-cpu-decisions) and from rows written for the test."""

import re

import pandas as pd

from conftest import REPO
from speedmatrix.core.table import html_page, markdown
from speedmatrix.jobs import aggregate
from speedmatrix.report import document, sections

RUN = REPO / "docs" / "results" / "tiny-cpu-decisions"


def test_the_summary_opens_the_report_and_answers_the_seeds_questions():
    m, d = aggregate.read_matrix(RUN / "matrix.parquet"), pd.read_parquet(RUN / "decisions.parquet")
    doc = document.blocks(m, [], {}, [], "tiny-cpu", "a description", decisions=d)
    text = markdown(doc)
    h2 = re.findall(r"^## (.+)$", text, flags=re.M)
    assert h2[:3] == ["Summary", "Run", "Servers"]
    summary = text.split("## Summary", 1)[1].split("\n## ", 1)[0]
    counts = m["status"].value_counts()
    assert f"{len(m)} cells on 2 server configs" in summary
    assert all(f"{n} {label}" in summary for label, n in (("Valid", counts["valid"]),
                                                           ("Unstable", counts["unstable"])))
    # each config's context x concurrency matrix, in the report's status words
    assert summary.count("| Context | 1 | 4 | 16 | 64 |") == 2 and "`base`" in summary and "`mtp2`" in summary
    assert "### Best config per target" in summary and "### Does speculation pay here?" in summary
    # speculation: the change over the decode cells both configs measured, with its sign
    both = sections.spec_versus_plain(m)
    assert len(both) > 0
    row = next(r for r in summary.splitlines() if r.startswith("| `mtp2` | "))
    assert f"{both['change'].median():+.0%}" in row and f"| {len(both)} |" in row
    # the cells to look at: every Unstable cell, linked to its row in the detail below
    assert "### Cells to look at" in summary
    unstable = m[m.status == "unstable"]
    for r in unstable.itertuples():
        assert f"[{r.cell_id}](#{sections.cell_anchor(r.server_id, r.cell_id)})" in summary


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
