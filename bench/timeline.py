"""Draw one cell's requests on a timeline: each request's start, first token and end, and the steady part.

    .venv/bin/python bench/timeline.py results/tiny-cpu base decode-ctx128-c4 --out docs/images/decode-timeline.png

A bar per request (grey: waiting for its first token; blue: streaming), the
decode window's end, and where the steady part begins (the first
``concurrency`` requests all have their first token): the part of the window
``output_throughput`` counts (docs/metrics.md, ``steady_fraction``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import altair as alt
import pandas as pd


def timeline(results: Path, server_id: str, cell_id: str, repeat: int = 1) -> alt.Chart:
    cell = json.loads((results / "cells" / server_id / f"{cell_id}.json").read_text())
    req = pd.read_parquet(results / "cells" / server_id / f"{cell_id}.requests.parquet")
    if "repeat" in req:
        req = req[req["repeat"] == repeat]
    spec, res = cell["cell"], cell["result"]
    reps = res.get("repeat_figures") or [res]
    fig = reps[repeat - 1]
    req = req.assign(first_s=req["start_s"] + req["ttft_ms"].fillna(0) / 1000,
                     end_s=req["end_s"].fillna(spec.get("duration_s") or req["end_s"].max()),
                     row=range(len(req)))
    window = float(spec.get("duration_s") or req["end_s"].max())
    steady_from = window - float(fig.get("steady_s") or 0) if fig.get("steady_s") else None
    base = alt.Chart(req).encode(y=alt.Y("row:O", title="request (in the order sent)", axis=alt.Axis(labels=False)))
    waiting = base.mark_bar(color="#bbbbbb").encode(x=alt.X("start_s:Q", title="seconds since the window opened"),
                                                    x2="first_s:Q")
    streaming = base.mark_bar(color="#4c78a8").encode(
        x="first_s:Q", x2="end_s:Q",
        tooltip=["request_index", "start_s", "ttft_ms", "end_s", "output_tokens", "finish_reason"])
    marks = [{"t": window, "what": "window ends"}]
    if steady_from is not None:
        marks.append({"t": steady_from, "what": "steady part begins"})
    rules = alt.Chart(pd.DataFrame(marks)).mark_rule(strokeDash=[4, 3], color="black").encode(
        x="t:Q", tooltip=["what", "t"])
    labels = alt.Chart(pd.DataFrame(marks)).mark_text(align="left", dx=3, dy=-4, baseline="bottom").encode(
        x="t:Q", y=alt.value(0), text="what:N")
    tok = fig.get("output_throughput")
    win = fig.get("output_throughput_window")
    title = (f"{server_id} {cell_id} (repeat {repeat}): steady {tok:.1f} tok/s over "
             f"{fig.get('steady_fraction', 0):.0%} of the window; whole window {win:.1f} tok/s"
             if tok is not None and win is not None else f"{server_id} {cell_id}")
    return alt.layer(waiting, streaming, rules, labels).properties(width=640, height=max(120, 9 * len(req)),
                                                                   title=title)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, help="results/<experiment>")
    ap.add_argument("server_id")
    ap.add_argument("cell_id")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True, help="a .png or .html file")
    ns = ap.parse_args(argv)
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    chart = timeline(ns.results, ns.server_id, ns.cell_id, ns.repeat)
    chart.save(str(ns.out), **({"scale_factor": 2} if ns.out.suffix == ".png" else {}))
    print(f"wrote {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
