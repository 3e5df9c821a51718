"""Charts with Altair, saved as HTML and PNG (vl-convert)."""

from __future__ import annotations

from pathlib import Path

import altair as alt
import pandas as pd

from .report import STATUS_LABEL, fmt_num


def decode_heatmap(matrix: pd.DataFrame) -> alt.Chart:
    """Context x concurrency per server config; colour = total tok/s, text = the number or the status."""
    d = matrix[matrix["workload"] == "decode"].copy()
    d["label"] = [
        fmt_num(v) if s == "valid" else STATUS_LABEL.get(s, s) for s, v in zip(d["status"], d["total_tok_s"])
    ]
    d["tok_s"] = d["total_tok_s"].where(d["status"] == "valid")
    base = alt.Chart(d).encode(
        x=alt.X("concurrency:O", title="simultaneous requests"),
        y=alt.Y("context_tokens:O", title="context (tokens)", sort="ascending"),
    )
    rect = base.mark_rect(stroke="white").encode(
        color=alt.Color("tok_s:Q", title="total tok/s", scale=alt.Scale(scheme="viridis")),
        tooltip=["server_id", "context_tokens", "concurrency", "status", "total_tok_s", "ttft_ms", "itl_ms"],
    )
    text = base.mark_text(fontSize=10).encode(text="label:N", color=alt.value("black"))
    return (
        alt.layer(rect, text, data=d)
        .properties(width=90 * max(1, d["concurrency"].nunique()), height=36 * max(1, d["context_tokens"].nunique()))
        .facet(column=alt.Column("server_id:N", title="server config"))
        .properties(title="Sustained decode: total tok/s")
    )


def save(chart: alt.Chart, html: str | Path, png: str | Path) -> None:
    chart.save(str(html))
    chart.save(str(png), scale_factor=2)
