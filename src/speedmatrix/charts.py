"""Charts with Altair, saved as HTML and PNG (vl-convert).

Each chart is a :class:`Chart` in :data:`CHARTS`: its ``data`` picks the rows
it draws from matrix.parquet (``None`` when there are none), its ``draw``
makes the Altair chart from them. A chart with no data says so itself: it is
saved as a one-line placeholder and left out of the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import altair as alt
import pandas as pd

from . import decide, workloads
from .report import fmt


def _kinds(flag: str) -> list[str]:
    """The workload kinds with a class attribute set (e.g. ``throughput``)."""
    return [n for n in workloads.names() if getattr(workloads.get(n), flag)]


def _valid(matrix: pd.DataFrame) -> pd.DataFrame:
    return matrix[matrix["status"].isin(["valid", "unstable"])]  # unstable: a figure, with a wide spread


def _none_if_empty(d: pd.DataFrame) -> pd.DataFrame | None:
    return None if d.empty else d


def heatmap_data(d: pd.DataFrame) -> pd.DataFrame | None:
    d = d.copy()
    d["label"] = [fmt.num(v) if s == "valid" else fmt.status(s) for s, v in zip(d["status"], d["total_tok_s"],
                                                                                   strict=True)]
    d["tok_s"] = d["total_tok_s"].where(d["status"] == "valid")
    return d


def decode_heatmap(d: pd.DataFrame) -> alt.Chart:
    """Context x concurrency per server config; colour = total tok/s, text = the number or the status."""
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


def throughput_data(matrix: pd.DataFrame) -> pd.DataFrame | None:
    d = _valid(matrix)
    d = d[d["workload"].isin(_kinds("throughput"))]
    return _none_if_empty(d.assign(context=d["context_tokens"].astype(str) + " tok"))


def throughput_concurrency(d: pd.DataFrame) -> alt.Chart:
    """Total output tok/s against requests at once, one line per context, per server config."""
    return (
        alt.Chart(d).mark_line(point=True).encode(
            x=alt.X("concurrency:Q", scale=alt.Scale(type="log", base=2), title="simultaneous requests"),
            y=alt.Y("total_tok_s:Q", title="total output tok/s"),
            color=alt.Color("context:N", title="context", sort=alt.SortField("context_tokens")),
            strokeDash=alt.StrokeDash("workload:N"),
            tooltip=["server_id", "workload", "context_tokens", "concurrency", "total_tok_s", "ttft_ms"],
        ).properties(width=260, height=200)
        .facet(facet=alt.Facet("server_id:N", title="server config"), columns=4)
        .properties(title="Throughput against concurrency, per context")
    )


def ttft_data(matrix: pd.DataFrame) -> pd.DataFrame | None:
    d = _valid(matrix)
    return _none_if_empty(d[d["workload"].isin(_kinds("one_at_a_time"))])


def ttft_context(d: pd.DataFrame) -> alt.Chart:
    """Median TTFT against prompt length (one-request-at-a-time cells), one line per server config."""
    return (
        alt.Chart(d).mark_line(point=True).encode(
            x=alt.X("context_tokens:Q", scale=alt.Scale(type="log", base=2), title="prompt tokens"),
            y=alt.Y("ttft_ms:Q", title="median TTFT (ms)"),
            color=alt.Color("server_id:N", title="server config"),
            strokeDash=alt.StrokeDash("workload:N"),
            tooltip=["server_id", "workload", "context_tokens", "ttft_ms", "prompt_tok_s"],
        ).properties(width=420, height=260, title="TTFT against context")
    )


def spec_data(matrix: pd.DataFrame) -> pd.DataFrame | None:
    """The cells measured at more than one speculative-token setting."""
    d = matrix[(matrix["status"] == "valid") & matrix["spec_tokens"].notna()]
    return _none_if_empty(d[d.groupby("cell_id")["spec_tokens"].transform("nunique") > 1])


def spec_sweep(d: pd.DataFrame) -> alt.Chart:
    """Output tok/s and acceptance rate against speculative tokens (cells with the same shape across configs)."""
    base = alt.Chart(d).encode(x=alt.X("spec_tokens:O", title="speculative tokens"),
                               color=alt.Color("cell_id:N", title="cell"))
    tok = base.mark_line(point=True).encode(y=alt.Y("mean(total_tok_s):Q", title="output tok/s"),
                                            tooltip=["cell_id", "spec_tokens", "mean(total_tok_s)"])
    acc = base.mark_line(point=True, strokeDash=[4, 3]).encode(
        y=alt.Y("mean(spec_acceptance_rate):Q", title="acceptance rate", scale=alt.Scale(domain=[0, 1])),
        tooltip=["cell_id", "spec_tokens", "mean(spec_acceptance_rate)"])
    return alt.hconcat(tok.properties(width=300, height=220, title="tok/s"),
                       acc.properties(width=300, height=220, title="acceptance (random weights: meaningless)")
                       ).properties(title="Speculative decoding sweep")


def prefix_data(d: pd.DataFrame) -> pd.DataFrame | None:
    """Cold and warm pass per sharing ratio, one row each."""
    d = d[d["status"] != "over_capacity"]
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
                                  column=alt.Column("share:N", title=None))
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
    base = alt.Chart(d).encode(
        x=alt.X("concurrency:Q", scale=alt.Scale(type="log", base=2), title="simultaneous requests"),
        color=alt.Color("context:N", title="context", sort=alt.SortField("context_tokens")),
    )
    power = base.mark_line(point=True).encode(
        y=alt.Y("mean(gpu_power_w):Q", title="GPU power (W)"),
        tooltip=["server_id", "context_tokens", "concurrency", "gpu_power_w", "gpu_sm_util_pct"])
    energy = base.mark_line(point=True).encode(
        y=alt.Y("mean(gpu_energy_per_output_token_j):Q", title="energy per output token (J)",
                scale=alt.Scale(type="log")),
        tooltip=["server_id", "context_tokens", "concurrency", "gpu_energy_per_output_token_j"])
    return alt.hconcat(power.properties(width=300, height=220, title="power"),
                       energy.properties(width=300, height=220, title="energy per output token")
                       ).properties(title="GPU telemetry (NVML, measurement windows only)")


def pareto_data(matrix: pd.DataFrame) -> pd.DataFrame | None:
    points = decide.frontier(decide.pareto_points(matrix))
    return None if points.empty else pareto_data_from_points(points)


def pareto_data_from_points(points: pd.DataFrame) -> pd.DataFrame:
    """Frontier points (decide.frontier) with what the chart shows: frontier or beaten, per GPU or server."""
    per = "GPU" if (pd.to_numeric(points.get("gpus"), errors="coerce") > 0).any() else "server"
    return points.assign(frontier=points["on_frontier"].map({True: "on the frontier", False: "beaten"}), per=per,
                         label=points["run"] + " · " + points["point"] if points["run"].nunique() > 1
                         else points["point"])


def pareto(d: pd.DataFrame) -> alt.Chart:
    """tok/s per user against tok/s per GPU (per server on the CPU); the frontier as a step line."""
    per = d["per"].iloc[0]
    x = alt.X("tok_s_per_user:Q", title="output tok/s per user", scale=alt.Scale(type="log"))
    y = alt.Y("tok_s_per_gpu:Q", title=f"output tok/s per {per}", scale=alt.Scale(type="log"))
    series = "run:N" if d["run"].nunique() > 1 else "server_id:N"
    tooltip = ["label", "status", "concurrency", "context_tokens", "tok_s_per_user", "tok_s_per_gpu", "ttft_ms"]
    dots = alt.Chart(d).mark_point(filled=True, size=60).encode(
        x=x, y=y, color=alt.Color(series, title="run" if series == "run:N" else "server config"),
        shape=alt.Shape("frontier:N", title=None), tooltip=tooltip)
    front = d[d["on_frontier"]].sort_values("tok_s_per_user")
    line = alt.Chart(front).mark_line(interpolate="step-before", color="black", strokeDash=[4, 3]).encode(x=x, y=y)
    return alt.layer(line, dots).properties(width=480, height=320,
                                             title="Pareto frontier: tok/s per user against tok/s per " + per)


def placeholder(text: str) -> alt.Chart:
    return alt.Chart(pd.DataFrame({"t": [text]})).mark_text(fontSize=14).encode(text="t:N").properties(
        width=400, height=60)


def save_chart(chart: alt.Chart, html: str | Path, png: str | Path) -> None:
    chart.save(str(html))
    chart.save(str(png), scale_factor=2)


@dataclass(frozen=True)
class Chart:
    """One chart of the report: its file name, title, rows and drawing."""

    name: str  # charts/<name>.html and .png; the report rule's outputs <name>_html, <name>_png
    title: str
    data: Callable[[pd.DataFrame], pd.DataFrame | None]
    draw: Callable[[pd.DataFrame], alt.Chart]
    empty: str  # what the placeholder says when there is no data
    kind: str | None = None  # a chart of one workload kind gets only that kind's rows

    def chart(self, matrix: pd.DataFrame) -> alt.Chart | None:
        rows = matrix if self.kind is None else matrix[matrix["workload"] == self.kind]
        d = self.data(rows) if len(rows) else None
        return None if d is None else self.draw(d)

    def save(self, matrix: pd.DataFrame, html: str | Path, png: str | Path) -> bool:
        """Draw and save the chart; with no data, a placeholder. True when the chart has data."""
        chart = self.chart(matrix)
        save_chart(placeholder(self.empty) if chart is None else chart, html, png)
        return chart is not None


CHARTS = [
    Chart("heatmap", "Sustained decode heatmap", heatmap_data, decode_heatmap, "no sustained-decode cells",
          kind="decode"),
    Chart("throughput", "Throughput against concurrency", throughput_data, throughput_concurrency,
          "no valid decode or capacity cells"),
    Chart("ttft", "TTFT against context", ttft_data, ttft_context, "no prefill or latency cells"),
    Chart("spec", "Speculative decoding sweep", spec_data, spec_sweep,
          "no cell measured at more than one speculative-token setting"),
    Chart("prefix", "Prefix cache cold against warm", prefix_data, prefix_cache, "no prefix-cache cells",
          kind="prefix_cache"),
    Chart("gpu", "GPU power and energy per token", gpu_data, gpu_telemetry,
          "no GPU telemetry (NVML absent: CPU run)"),
    Chart("pareto", "Pareto frontier", pareto_data, pareto, "no valid capacity or decode cells"),
]
