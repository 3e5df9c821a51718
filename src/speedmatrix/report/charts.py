"""Charts with Altair: interactive in report.html (their Vega-Lite specs, drawn by the Vega code inlined in the
page), PNG (vl-convert) for report.md and ``snakemake --report``.

Each chart is a :class:`Chart` in :data:`CHARTS`: its ``data`` picks the rows
it draws from matrix.parquet, or from requests.parquet for the per-request
views (``None`` when there are none), its ``draw`` makes the Altair chart from
them, and ``applies`` says from the experiment alone whether it can have data
(the workflow declares only those charts: a CPU run has no GPU chart). A chart
that applies but finds no rows is saved as a one-line placeholder and left out
of the report. Every chart has tooltips with its cells' figures; where it has a
colour legend, a click on the legend filters it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

from .. import workloads
from ..core import fmt
from ..core.status import USABLE, Status
from ..judge import decide

TRADE_OFF = "Pareto frontier"  # the trade-off chart's title (the report's summary shows it)


def _kinds(flag: str) -> list[str]:
    """The workload kinds with a class attribute set (e.g. ``throughput``)."""
    return [n for n in workloads.names() if getattr(workloads.get(n), flag)]


def _valid(matrix: pd.DataFrame) -> pd.DataFrame:
    return matrix[matrix["status"].isin(USABLE)]  # unstable: a figure, with a wide spread


def _none_if_empty(d: pd.DataFrame) -> pd.DataFrame | None:
    return None if d.empty else d


def legend_filter(field: str) -> tuple[Any, Any]:
    """A selection bound to the colour legend of ``field`` and the opacity that shows it: click a legend entry
    to keep only its marks (shift-click for several; click the background to show all)."""
    pick = alt.selection_point(fields=[field], bind="legend")
    return pick, alt.condition(pick, alt.value(1.0), alt.value(0.12))


def heatmap_data(d: pd.DataFrame) -> pd.DataFrame | None:
    d = d.copy()
    d["label"] = [fmt.num(v) if s == Status.VALID else fmt.status(s) for s, v in zip(d["status"], d["total_tok_s"],
                                                                                   strict=True)]
    d["tok_s"] = d["total_tok_s"].where(d["status"] == Status.VALID)
    return d


def decode_heatmap(d: pd.DataFrame) -> alt.Chart:
    """Context x concurrency per server config; colour = total tok/s, text = the number or the status."""
    base = alt.Chart(d).encode(
        x=alt.X("concurrency:O", title="simultaneous requests"),
        y=alt.Y("context_tokens:O", title="context (tokens)", sort="ascending"),
    )
    rect = base.mark_rect(stroke="white").encode(
        color=alt.Color("tok_s:Q", title="total tok/s", scale=alt.Scale(scheme="viridis")),
        tooltip=["server_id", "context_tokens", "concurrency", "status", "total_tok_s", "ttft_ms", "tbt_ms"],
    )
    # viridis runs from dark (few tok/s) to light: white labels on the darker half, black on the lighter;
    # a cell with no figure (a status) has no colour and a black label
    mid = float(d["tok_s"].min() + d["tok_s"].max()) / 2 if d["tok_s"].notna().any() else 0.0
    text = base.mark_text(fontSize=10).encode(
        text="label:N",
        color=alt.condition(f"isValid(datum.tok_s) && datum.tok_s < {mid}", alt.value("white"), alt.value("black")),
        tooltip=["server_id", "context_tokens", "concurrency", "status", "total_tok_s", "ttft_ms", "tbt_ms"])
    return (
        alt.layer(rect, text, data=d)
        .properties(width=90 * max(1, d["concurrency"].nunique()), height=36 * max(1, d["context_tokens"].nunique()))
        .facet(column=alt.Column("server_id:N", title="server config"))
        .properties(title="Sustained decode: total tok/s")
    )


def throughput_data(matrix: pd.DataFrame) -> pd.DataFrame | None:
    d = _valid(matrix)
    d = d[d["workload"].isin(_kinds("throughput"))]
    return _none_if_empty(d.assign(context=d["context_tokens"].astype(str) + " tok"))


def throughput_concurrency(d: pd.DataFrame) -> alt.Chart:
    """Total output tok/s against requests at once, one line per context, per server config."""
    pick, shown = legend_filter("context")
    return (
        alt.Chart(d).mark_line(point=True).encode(
            opacity=shown,
            x=alt.X("concurrency:Q", scale=alt.Scale(type="log", base=2), title="simultaneous requests"),
            y=alt.Y("total_tok_s:Q", title="total output tok/s"),
            color=alt.Color("context:N", title="context", sort=alt.SortField("context_tokens")),
            strokeDash=alt.StrokeDash("workload:N"),
            tooltip=["server_id", "workload", "context_tokens", "concurrency", "status", "total_tok_s",
                     "tok_s_per_user", "ttft_ms", "tbt_ms"],
        ).add_params(pick).properties(width=260, height=200)
        .facet(facet=alt.Facet("server_id:N", title="server config"), columns=4)
        .properties(title="Throughput against concurrency, per context")
    )


def ttft_data(matrix: pd.DataFrame) -> pd.DataFrame | None:
    d = _valid(matrix)
    return _none_if_empty(d[d["workload"].isin(_kinds("one_at_a_time"))])


def ttft_context(d: pd.DataFrame) -> alt.Chart:
    """Median TTFT against prompt length (one-request-at-a-time cells), one line per server config."""
    pick, shown = legend_filter("server_id")
    return (
        alt.Chart(d).mark_line(point=True).encode(
            opacity=shown,
            x=alt.X("context_tokens:Q", scale=alt.Scale(type="log", base=2), title="prompt tokens"),
            y=alt.Y("ttft_ms:Q", title="median TTFT (ms)"),
            color=alt.Color("server_id:N", title="server config"),
            strokeDash=alt.StrokeDash("workload:N"),
            tooltip=["server_id", "workload", "context_tokens", "status", "ttft_ms", "p95_ttft_ms", "prompt_tok_s"],
        ).add_params(pick).properties(width=420, height=260, title="TTFT against context")
    )


def spec_data(matrix: pd.DataFrame) -> pd.DataFrame | None:
    """The cells measured at more than one speculative-token setting (an unstable cell is a figure with a wide
    spread, shown as the other charts show it)."""
    d = _valid(matrix)
    d = d[d["spec_tokens"].notna()]
    return _none_if_empty(d[d.groupby("cell_id")["spec_tokens"].transform("nunique") > 1])


def spec_sweep(d: pd.DataFrame) -> alt.Chart:
    """Output tok/s and acceptance rate against speculative tokens (cells with the same shape across configs)."""
    pick, shown = legend_filter("cell_id")
    base = alt.Chart(d).encode(x=alt.X("spec_tokens:O", title="speculative tokens"),
                               color=alt.Color("cell_id:N", title="cell"), opacity=shown)
    tok = base.mark_line(point=True).encode(y=alt.Y("mean(total_tok_s):Q", title="output tok/s"),
                                            tooltip=["cell_id", "spec_tokens", "mean(total_tok_s)"])
    acc = base.mark_line(point=True, strokeDash=[4, 3]).encode(
        y=alt.Y("mean(spec_acceptance_rate):Q", title="acceptance rate", scale=alt.Scale(domain=[0, 1])),
        tooltip=["cell_id", "spec_tokens", "mean(spec_acceptance_rate)"])
    return alt.hconcat(tok.add_params(pick).properties(width=300, height=220, title="tok/s"),
                       acc.properties(width=300, height=220, title="acceptance rate")
                       ).properties(title="Speculative decoding sweep")


def prefix_data(d: pd.DataFrame) -> pd.DataFrame | None:
    """Cold and warm pass per sharing ratio, one row each."""
    d = d[d["status"] != Status.OVER_CAPACITY]
    rows = []
    for r in d.itertuples():
        share = f"{float(r.shared_prefix):.1%} shared"
        rows.append({"server_id": r.server_id, "share": share, "pass": "cold", "mean_ttft_ms": r.cold_mean_ttft_ms,
                     "hit_rate": r.cold_prefix_cache_hit_rate})
        rows.append({"server_id": r.server_id, "share": share, "pass": "warm", "mean_ttft_ms": r.mean_ttft_ms,
                     "hit_rate": r.prefix_cache_hit_rate})
    return pd.DataFrame(rows) if rows else None


def prefix_cache(long: pd.DataFrame) -> alt.Chart:
    """Cold against warm pass per sharing ratio: mean TTFT and token hit rate."""
    base = alt.Chart(long).encode(x=alt.X("pass:N", title=None), color=alt.Color("pass:N"),
                                  column=alt.Column("share:N", title=None),
                                  tooltip=["server_id", "share", "pass", "mean_ttft_ms", "hit_rate"])
    return alt.vconcat(
        base.mark_bar().encode(y=alt.Y("mean(mean_ttft_ms):Q", title="mean TTFT (ms)")).properties(width=90),
        base.mark_bar().encode(y=alt.Y("mean(hit_rate):Q", title="token hit rate",
                                       scale=alt.Scale(domain=[0, 1]))).properties(width=90),
    ).properties(title="Prefix cache: cold against warm")


def gpu_data(matrix: pd.DataFrame) -> pd.DataFrame | None:
    if "gpu_power_w" not in matrix:
        return None
    d = _valid(matrix)
    d = d[d["workload"].isin(_kinds("throughput")) & d["gpu_power_w"].notna()]
    return _none_if_empty(d.assign(context=d["context_tokens"].astype(str) + " tok"))


def gpu_telemetry(d: pd.DataFrame) -> alt.Chart:
    """GPU power and energy per output token against concurrency, one line per context."""
    pick, shown = legend_filter("context")
    base = alt.Chart(d).encode(
        x=alt.X("concurrency:Q", scale=alt.Scale(type="log", base=2), title="simultaneous requests"),
        color=alt.Color("context:N", title="context", sort=alt.SortField("context_tokens")), opacity=shown,
    )
    power = base.mark_line(point=True).encode(
        y=alt.Y("mean(gpu_power_w):Q", title="GPU power (W)"),
        tooltip=["server_id", "context_tokens", "concurrency", "gpu_power_w", "gpu_sm_util_pct"])
    energy = base.mark_line(point=True).encode(
        y=alt.Y("mean(gpu_energy_per_output_token_j):Q", title="energy per output token (J)",
                scale=alt.Scale(type="log")),
        tooltip=["server_id", "context_tokens", "concurrency", "gpu_energy_per_output_token_j"])
    return alt.hconcat(power.add_params(pick).properties(width=300, height=220, title="power"),
                       energy.properties(width=300, height=220, title="energy per output token")
                       ).properties(title="GPU telemetry (NVML, measurement windows only)")


def pareto_data(matrix: pd.DataFrame) -> pd.DataFrame | None:
    points = decide.frontier(decide.pareto_points(matrix))
    return None if points.empty else pareto_data_from_points(points)


def pareto_data_from_points(points: pd.DataFrame) -> pd.DataFrame:
    """Frontier points (decide.frontier) with what the chart shows: frontier or beaten, per GPU or server, and the
    line each point is on (a config's cells of one kind and context, through their concurrencies)."""
    per = decide.per_unit(points)
    several = points["run"].nunique() > 1
    line = points["server_id"] + " · " + points["workload"] + " " + points["context_tokens"].map(
        lambda c: fmt.ctx(int(c)))
    return points.assign(frontier=points["on_frontier"].map({True: "on the frontier", False: "beaten"}), per=per,
                         label=points["run"] + " · " + points["point"] if several else points["point"],
                         line=points["run"] + " · " + line if several else line)


def pareto(d: pd.DataFrame) -> alt.Chart:
    """tok/s per user against tok/s per GPU (per server on the CPU), as ``vllm bench sweep``'s Pareto plot: one
    line per config (and kind and context) through its concurrencies, each point labelled with its concurrency,
    the frontier as a dashed step line."""
    per = d["per"].iloc[0]
    log = alt.Scale(type="log", nice=False, padding=12)  # the points' own range, not the next power of ten
    x = alt.X("tok_s_per_user:Q", title="output tok/s per user", scale=log)
    y = alt.Y("tok_s_per_gpu:Q", title=f"output tok/s per {per}", scale=log)
    series = "run:N" if d["run"].nunique() > 1 else "server_id:N"
    pick, shown = legend_filter(series[:-2])
    colour = alt.Color(series, title="run" if series == "run:N" else "server config")
    tooltip = ["label", "status", "concurrency", "context_tokens", "tok_s_per_user", "tok_s_per_gpu", "ttft_ms"]
    base = alt.Chart(d).encode(x=x, y=y, color=colour, opacity=shown)
    lines = base.mark_line(strokeWidth=1.5).encode(detail="line:N", order="concurrency:Q")
    dots = base.mark_point(filled=True, size=60).encode(shape=alt.Shape("frontier:N", title=None),
                                                        tooltip=tooltip).add_params(pick)
    labels = base.mark_text(dx=7, dy=-7, fontSize=10).encode(text="concurrency:Q")
    front = d[d["on_frontier"]].sort_values("tok_s_per_user")
    frontier = alt.Chart(front).mark_line(interpolate="step-before", color="black", strokeDash=[4, 3]).encode(
        x=x, y=y)
    return alt.layer(frontier, lines, dots, labels).properties(
        width=480, height=320, title=f"{TRADE_OFF}: tok/s per user against tok/s per {per}, by concurrency")


def _usable_throughput(matrix: pd.DataFrame) -> pd.DataFrame:
    return _valid(matrix)[lambda m: m["workload"].isin(_kinds("throughput"))]


def timeline_cell(matrix: pd.DataFrame) -> tuple[str, str] | None:
    """The cell the timeline shows: of the first server config, the usable throughput cell with the most
    requests at once (then the longest context)."""
    d = _usable_throughput(matrix)
    if d.empty:
        return None
    d = d.sort_values(["server_id", "concurrency", "context_tokens"], ascending=[True, False, False])
    r = d.iloc[0]
    return str(r["server_id"]), str(r["cell_id"])


def timeline_data(matrix: pd.DataFrame, requests: pd.DataFrame | None) -> pd.DataFrame | None:
    pick = timeline_cell(matrix)
    if pick is None or requests is None or requests.empty:
        return None
    sid, cid = pick
    r = requests[(requests["server_id"] == sid) & (requests["cell_id"] == cid)]
    if "repeat" in r:
        r = r[r["repeat"] == r["repeat"].min()]
    r = r.sort_values("start_s").head(300)
    if r.empty:
        return None
    first = r["start_s"] + r["ttft_ms"].fillna(0) / 1000.0
    return pd.DataFrame({"cell": f"{sid} · {cid}", "request": range(1, len(r) + 1), "start_s": r["start_s"],
                         "first_token_s": first.where(r["ttft_ms"].notna()), "end_s": r["end_s"],
                         "ttft_ms": r["ttft_ms"], "output_tokens": r["output_tokens"],
                         "cut_at_window_end": r["cut_at_window_end"], "error": r["error"]})


def timeline(d: pd.DataFrame) -> alt.Chart:
    """Each request of one cell: waiting for its first token (grey), then streaming (blue), in start order."""
    y = alt.Y("request:O", title="request (in start order)", axis=alt.Axis(labels=len(d) <= 60))
    tip = ["request", "start_s", "ttft_ms", "end_s", "output_tokens", "cut_at_window_end", "error"]
    wait = alt.Chart(d).mark_rule(color="#bbbbbb", strokeWidth=3).encode(
        x=alt.X("start_s:Q", title="seconds since the cell's start"), x2="first_token_s:Q", y=y, tooltip=tip)
    stream = alt.Chart(d).mark_rule(color="#3b75af", strokeWidth=3).encode(x="first_token_s:Q", x2="end_s:Q", y=y,
                                                                           tooltip=tip)
    first = alt.Chart(d).mark_tick(color="black", thickness=1).encode(x="first_token_s:Q", y=y, tooltip=tip)
    return alt.layer(wait, stream, first).properties(
        width=640, height=min(600, 8 * len(d) + 40),
        title=f"Request timeline of {d['cell'].iloc[0]}: waiting for the first token (grey), streaming (blue)")


def latency_data(matrix: pd.DataFrame, requests: pd.DataFrame | None) -> pd.DataFrame | None:
    """Per request of every usable throughput cell: TTFT and its mean gap between streamed events."""
    d = _usable_throughput(matrix)
    if d.empty or requests is None or requests.empty:
        return None
    keep = set(zip(d["server_id"], d["cell_id"]))
    r = requests[[k in keep for k in zip(requests["server_id"], requests["cell_id"])]]
    if r.empty:
        return None
    gaps = (r["end_s"] - r["start_s"] - r["ttft_ms"] / 1000.0) / (r["chunks"] - 1)
    return pd.DataFrame({"server_id": r["server_id"], "cell_id": r["cell_id"], "ttft_ms": r["ttft_ms"],
                         "mean_itl_ms": (gaps * 1000.0).where(r["chunks"] >= 2)})


def latency_distributions(d: pd.DataFrame) -> alt.Chart:
    """TTFT and the mean gap between streamed events, per request, as a box per cell (one colour a config)."""
    # (no legend filter: a selection on a box plot, a composite mark, is added once per part and Vega
    # refuses the duplicate signal)
    base = alt.Chart(d).encode(x=alt.X("cell_id:N", title=None, sort=None),
                               color=alt.Color("server_id:N", title="server config"))
    ttft = base.mark_boxplot(extent="min-max").encode(
        y=alt.Y("ttft_ms:Q", title="TTFT (ms)", scale=alt.Scale(type="log")), xOffset="server_id:N")
    itl = base.mark_boxplot(extent="min-max").encode(
        y=alt.Y("mean_itl_ms:Q", title="mean ITL of a request (ms)", scale=alt.Scale(type="log")),
        xOffset="server_id:N")
    return alt.vconcat(ttft.properties(width=640, height=200, title="TTFT per request"),
                       itl.properties(width=640, height=200, title="mean gap between streamed events, per request")
                       ).properties(title="Latency distributions per cell")


def rate_data(matrix: pd.DataFrame) -> pd.DataFrame | None:
    """Output and goodput tok/s against the offered rate: each kind's open-loop points (``Workload.rate_points``: a
    rate cell, the open-loop steps of a rate sweep)."""
    rows = [{"server_id": r.server_id, **p} for r in matrix.itertuples()
            for p in workloads.get(r.workload).rate_points(r)]
    if not rows:
        return None
    d = pd.DataFrame(rows)
    d["status"] = d["status"].map(fmt.status)
    return d.melt(id_vars=["server_id", "series", "offered_rate_rps", "achieved_rate_rps", "slo", "status"],
                  value_vars=["output_tok_s", "goodput_tok_s"], var_name="figure", value_name="tok_s").replace(
        {"figure": {"output_tok_s": "output tok/s", "goodput_tok_s": "goodput tok/s (target met)"}})


def rate_goodput(d: pd.DataFrame) -> alt.Chart:
    """Output and goodput tok/s against the offered rate, one line per server config and series; a point's shape
    its status (a client-bound or saturated point is not the server's steady state)."""
    return (
        alt.Chart(d).mark_line(point=alt.OverlayMarkDef(size=70, filled=True)).encode(
            x=alt.X("offered_rate_rps:Q", title="offered rate (requests/s)"),
            y=alt.Y("tok_s:Q", title="tok/s"),
            color=alt.Color("server_id:N", title="server config"),
            strokeDash=alt.StrokeDash("figure:N", title=None, legend=alt.Legend(symbolType="stroke")),
            shape=alt.Shape("status:N", title="status"),
            detail="series:N",
            tooltip=["server_id", "series", "offered_rate_rps", "achieved_rate_rps", "figure", "tok_s", "slo",
                     "status"],
        ).properties(width=300, height=220)
        .facet(facet=alt.Facet("series:N", title=None), columns=3)
        .properties(title="Goodput and output against the offered rate")
    )


def lag_data(matrix: pd.DataFrame, requests: pd.DataFrame | None) -> pd.DataFrame | None:
    """Every counted open-loop request's send lag (sent minus scheduled), per rate cell, or per step of a sweep or
    search."""
    kinds = matrix[matrix["workload"].isin(_kinds("open_loop")) & (matrix["status"] != Status.OVER_CAPACITY)]
    if kinds.empty or requests is None or requests.empty or "scheduled_s" not in requests:
        return None
    keep = set(zip(kinds["server_id"], kinds["cell_id"]))
    r = requests[[k in keep for k in zip(requests["server_id"], requests["cell_id"])]]
    r = r[r["scheduled_s"].notna() & r["counted"].fillna(True).astype(bool)]
    if r.empty:
        return None
    # a cell at one rate by its rate and arrival; a cell of several steps (a sweep, a search) by its step
    rate = r["cell_id"].str.extract(r"-r([0-9.]+)-([a-z0-9.]+)", expand=True)
    kind = r["cell_id"].str.extract(r"^([a-z_]+)-ctx([0-9]+)", expand=True)
    label = (rate[0] + " req/s " + rate[1] + ", ctx " + kind[1]).where(
        rate[0].notna(), kind[0].str.replace("_", " ") + " " + r["phase"] + ", ctx " + kind[1])
    return pd.DataFrame({"server_id": r["server_id"], "cell": label,
                         "lag_ms": ((r["start_s"] - r["scheduled_s"]) * 1000.0).clip(lower=0.01)})


def lag_distribution(d: pd.DataFrame) -> alt.Chart:
    """The send lag's distribution as a box per cell (a client that keeps its schedule stays near zero)."""
    return alt.Chart(d).mark_boxplot(extent="min-max").encode(
        x=alt.X("cell:N", title=None, sort=None, axis=alt.Axis(labelAngle=-30, labelLimit=240)),
        xOffset="server_id:N",
        y=alt.Y("lag_ms:Q", title="send lag (ms, log)", scale=alt.Scale(type="log")),
        color=alt.Color("server_id:N", title="server config"),
    ).properties(width=640, height=220, title="Send lag of open-loop requests (sent minus scheduled)")


def _kinds_with_column(column: str) -> set[str]:
    """The workload kinds that fill a matrix column of their own."""
    return {n for n in workloads.names() if column in workloads.get(n).column_names()}


def session_data(matrix: pd.DataFrame) -> pd.DataFrame | None:
    """Per turn of every session cell: TTFT p50 and the share of the prompt served from the prefix cache."""
    if "session_turns" not in matrix:
        return None
    rows = []
    for r in matrix[matrix["session_turns"].notna()].itertuples():
        for t in json.loads(r.session_turns):
            rows.append({"server_id": r.server_id, "cell": f"{int(r.concurrency)} users, {r.server_id}",
                         "users": int(r.concurrency), "turn": t["turn"], "ttft_p50_ms": t["ttft_p50_ms"],
                         "cached_share": t["cached_share"], "prompt_tokens": t["prompt_tokens"]})
    return pd.DataFrame(rows) if rows else None


def session_turns(d: pd.DataFrame) -> alt.Chart:
    """TTFT and the cached share of the prompt against the turn, one line per cell (users, config)."""
    base = alt.Chart(d).encode(x=alt.X("turn:O", title="turn"), color=alt.Color("cell:N", title="cell"),
                               tooltip=["server_id", "users", "turn", "prompt_tokens", "ttft_p50_ms", "cached_share"])
    ttft = base.mark_line(point=True).encode(y=alt.Y("ttft_p50_ms:Q", title="median TTFT (ms)"))
    hits = base.mark_line(point=True).encode(y=alt.Y("cached_share:Q", title="prompt served from the cache",
                                                     axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])))
    return alt.hconcat(ttft.properties(width=300, height=220, title="TTFT by turn"),
                       hits.properties(width=300, height=220, title="Prefix cache's share of the prompt by turn")
                       ).properties(title="Multi-turn sessions")


def replay_data(matrix: pd.DataFrame, requests: pd.DataFrame | None) -> pd.DataFrame | None:
    """Every replay cell's requests counted over time: as the trace scheduled them and as the client sent them."""
    cells = matrix[matrix["workload"].isin(_kinds("reads_trace")) & (matrix["status"] != Status.OVER_CAPACITY)]
    if cells.empty or requests is None or requests.empty or "scheduled_s" not in requests:
        return None
    out = []
    for r in cells.itertuples():
        q = requests[(requests["server_id"] == r.server_id) & (requests["cell_id"] == r.cell_id)]
        label = f"{r.server_id} · {r.cell_id}"
        for what, col in (("scheduled", "scheduled_s"), ("sent", "start_s")):
            times = q[col].dropna().sort_values().to_numpy()
            out.append(pd.DataFrame({"cell": label, "series": what, "t_s": times,
                                     "requests": range(1, len(times) + 1)}))
    return pd.concat(out) if out else None


def replay_timeline(d: pd.DataFrame) -> alt.Chart:
    """Requests scheduled and sent against time, per replay cell: a client that keeps the trace's schedule draws
    one line over the other."""
    return alt.Chart(d).mark_line(interpolate="step-after").encode(
        x=alt.X("t_s:Q", title="seconds since the replay's start"), y=alt.Y("requests:Q", title="requests"),
        color=alt.Color("series:N", title=None), strokeDash=alt.StrokeDash("series:N", title=None),
        tooltip=["cell", "series", "t_s", "requests"],
    ).properties(width=300, height=200).facet(facet=alt.Facet("cell:N", title=None), columns=2).properties(
        title="Trace replay: requests scheduled against sent")


def placeholder(text: str) -> alt.Chart:
    return alt.Chart(pd.DataFrame({"t": [text]})).mark_text(fontSize=14).encode(text="t:N").properties(
        width=400, height=60)


@functools.lru_cache(maxsize=1)
def vega_js() -> str:
    """Vega, Vega-Lite and vega-embed as one script (vl-convert ships them: no download), about 0.9 MB;
    it sets window.vegaEmbed. A page includes it once, however many charts it has."""
    import vl_convert

    return vl_convert.javascript_bundle()


def save_png(chart: alt.Chart, png: str | Path) -> None:
    """The chart as a PNG at twice its size, its colours reduced to a 256-colour palette (a chart has a few flat
    colours and their anti-aliased edges: the file is several times smaller, and looks the same)."""
    from PIL import Image

    chart.save(str(png), scale_factor=2)
    with Image.open(png) as im:
        flat = Image.alpha_composite(Image.new("RGBA", im.size, "white"), im.convert("RGBA")).convert("RGB")
    flat.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(png, optimize=True)


def _kinds_in(exp: Any) -> set[str]:
    return {c.workload for c in exp.cells()}


# the rows a chart embeds at most (Altair refuses more than 5,000 by default; the HTML page inlines every row)
MAX_ROWS = 5000


@dataclass(frozen=True)
class Chart:
    """One chart of the report: its file name, title, rows and drawing."""

    name: str  # charts/<name>.png; the report rule's output <name>_png
    title: str
    data: Callable[..., pd.DataFrame | None]  # (matrix) or, for source "requests", (matrix, requests)
    draw: Callable[[pd.DataFrame], alt.Chart]
    empty: str  # what the placeholder says when there is no data
    trait: str | None = None  # a chart of the kinds with this trait (a Workload attribute) gets only their rows
    source: str = "matrix"  # "requests": drawn from requests.parquet (per-request views)
    # from the experiment alone: can this chart have data? (the workflow declares only those that can)
    applies: Callable[[Any], bool] = lambda exp: True

    def rows(self, matrix: pd.DataFrame, requests: pd.DataFrame | None = None) -> pd.DataFrame | None:
        """The rows the chart draws; past :data:`MAX_ROWS` (a GPU run's open-loop cells have tens of thousands of
        requests) every k-th of them, in their order, so that each cell keeps its share, and
        ``attrs["thinned"] = (k, all rows)``."""
        rows = matrix if self.trait is None else matrix[matrix["workload"].isin(_kinds(self.trait))]
        if not len(rows):
            return None
        d = self.data(rows, requests) if self.source == "requests" else self.data(rows)
        if d is None or len(d) <= MAX_ROWS:
            return d
        step = -(-len(d) // MAX_ROWS)
        thinned = d.iloc[::step].copy()
        thinned.attrs["thinned"] = (step, len(d))
        return thinned

    def chart(self, matrix: pd.DataFrame, requests: pd.DataFrame | None = None) -> alt.Chart | None:
        d = self.rows(matrix, requests)
        if d is None:
            return None
        chart = self.draw(d)
        if "thinned" in d.attrs:
            step, total = d.attrs["thinned"]
            title = chart.title if isinstance(chart.title, str) else self.title
            chart = chart.properties(title=alt.TitleParams(
                text=title, subtitle=f"one row in {step} of {total:,} drawn (a page stays small)"))
        return chart

    def save(self, matrix: pd.DataFrame, png: str | Path, requests: pd.DataFrame | None = None) -> alt.Chart | None:
        """Draw the chart and save its PNG (a placeholder when there is no data); the chart, or None."""
        chart = self.chart(matrix, requests)
        save_png(placeholder(self.empty) if chart is None else chart, png)
        return chart


def _throughput_cells(exp: Any) -> bool:
    return bool(_kinds_in(exp) & set(_kinds("throughput")))


CHARTS = [
    Chart("heatmap", "Sustained decode heatmap", heatmap_data, decode_heatmap, "no sustained-decode cells",
          trait="headline", applies=lambda exp: bool(_kinds_in(exp) & set(_kinds("headline")))),
    Chart("throughput", "Throughput against concurrency", throughput_data, throughput_concurrency,
          "no valid decode or capacity cells", applies=_throughput_cells),
    Chart("ttft", "TTFT against context", ttft_data, ttft_context, "no prefill or latency cells",
          applies=lambda exp: bool(_kinds_in(exp) & set(_kinds("one_at_a_time")))),
    Chart("spec", "Speculative decoding sweep", spec_data, spec_sweep,
          "no cell measured at more than one speculative-token setting",
          applies=lambda exp: len({s.spec_tokens for s in exp.servers}) > 1),
    Chart("prefix", "Prefix cache cold against warm", prefix_data, prefix_cache, "no prefix-cache cells",
          trait="shared_prefix", applies=lambda exp: bool(_kinds_in(exp) & set(_kinds("shared_prefix")))),
    Chart("gpu", "GPU power and energy per token", gpu_data, gpu_telemetry,
          "no GPU telemetry (NVML absent: CPU run)", applies=lambda exp: exp.runtime["device"] != "cpu"),
    Chart("pareto", TRADE_OFF, pareto_data, pareto, "no valid capacity or decode cells",
          applies=_throughput_cells),
    Chart("timeline", "Request timeline", timeline_data, timeline, "no valid capacity or decode cells",
          source="requests", applies=_throughput_cells),
    Chart("latency", "Latency distributions", latency_data, latency_distributions,
          "no valid capacity or decode cells", source="requests", applies=_throughput_cells),
    Chart("rate", "Goodput against offered rate", rate_data, rate_goodput, "no open-loop cells measured",
          applies=lambda exp: bool(_kinds_in(exp) & set(_kinds("open_loop")))),
    Chart("lag", "Send lag of open-loop requests", lag_data, lag_distribution, "no open-loop cells measured",
          source="requests", applies=lambda exp: bool(_kinds_in(exp) & set(_kinds("open_loop")))),
    Chart("sessions", "Multi-turn sessions by turn", session_data, session_turns, "no session cells measured",
          applies=lambda exp: bool(_kinds_in(exp) & _kinds_with_column("session_turns"))),
    Chart("replay", "Trace replay: scheduled against sent", replay_data, replay_timeline, "no replay cells measured",
          source="requests", applies=lambda exp: bool(_kinds_in(exp) & set(_kinds("reads_trace")))),
]


def applicable(exp: Any) -> list[Chart]:
    """The charts the experiment can have data for (the report rule's outputs)."""
    return [c for c in CHARTS if c.applies(exp)]
