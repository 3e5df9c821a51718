"""Charts with Altair, saved as HTML and PNG (vl-convert)."""

from __future__ import annotations

from pathlib import Path

import altair as alt
import pandas as pd

from .report import STATUS_LABEL, fmt_num


def decode_heatmap(matrix: pd.DataFrame) -> alt.Chart:
    """Context x concurrency per server config; colour = total tok/s, text = the number or the status."""
    d = matrix[matrix["workload"] == "decode"].copy()
    if d.empty:
        return _empty("no sustained-decode cells")
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


def _empty(text: str) -> alt.Chart:
    return alt.Chart(pd.DataFrame({"t": [text]})).mark_text(fontSize=14).encode(text="t:N").properties(
        width=400, height=60)


def throughput_concurrency(matrix: pd.DataFrame) -> alt.Chart:
    """Total output tok/s against requests at once, one line per context, per server config."""
    d = matrix[matrix["workload"].isin(["decode", "capacity"]) & (matrix["status"] == "valid")]
    if d.empty:
        return _empty("no valid decode or capacity cells")
    d = d.assign(context=d["context_tokens"].astype(str) + " tok")
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


def ttft_context(matrix: pd.DataFrame) -> alt.Chart:
    """Median TTFT against prompt length (prefill and latency cells), one line per server config."""
    d = matrix[matrix["workload"].isin(["prefill", "latency"]) & (matrix["status"] == "valid")]
    if d.empty:
        return _empty("no prefill or latency cells")
    return (
        alt.Chart(d).mark_line(point=True).encode(
            x=alt.X("context_tokens:Q", scale=alt.Scale(type="log", base=2), title="prompt tokens"),
            y=alt.Y("ttft_ms:Q", title="median TTFT (ms)"),
            color=alt.Color("server_id:N", title="server config"),
            strokeDash=alt.StrokeDash("workload:N"),
            tooltip=["server_id", "workload", "context_tokens", "ttft_ms", "prompt_tok_s"],
        ).properties(width=420, height=260, title="TTFT against context")
    )


def spec_sweep(matrix: pd.DataFrame) -> alt.Chart:
    """Output tok/s and acceptance rate against speculative tokens (cells with the same shape across configs)."""
    d = matrix[(matrix["status"] == "valid") & matrix["spec_tokens"].notna()]
    d = d[d.groupby("cell_id")["spec_tokens"].transform("nunique") > 1]
    if d.empty:
        return _empty("no cell measured at more than one speculative-token setting")
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


def prefix_cache(matrix: pd.DataFrame) -> alt.Chart:
    """Cold against warm pass per sharing ratio: mean TTFT and token hit rate."""
    d = matrix[(matrix["workload"] == "prefix_cache") & (matrix["status"] != "over_capacity")]
    if d.empty:
        return _empty("no prefix-cache cells")
    rows = []
    for r in d.itertuples():
        share = f"{float(r.shared_prefix):.1%} shared"
        rows.append({"server_id": r.server_id, "share": share, "pass": "cold", "mean_ttft_ms": r.cold_mean_ttft_ms,
                     "hit_rate": r.cold_prefix_cache_hit_rate})
        rows.append({"server_id": r.server_id, "share": share, "pass": "warm", "mean_ttft_ms": r.mean_ttft_ms,
                     "hit_rate": r.prefix_cache_hit_rate})
    long = pd.DataFrame(rows)
    base = alt.Chart(long).encode(x=alt.X("pass:N", title=None), color=alt.Color("pass:N"),
                                  column=alt.Column("share:N", title=None))
    return alt.vconcat(
        base.mark_bar().encode(y=alt.Y("mean(mean_ttft_ms):Q", title="mean TTFT (ms)")).properties(width=90),
        base.mark_bar().encode(y=alt.Y("mean(hit_rate):Q", title="token hit rate",
                                       scale=alt.Scale(domain=[0, 1]))).properties(width=90),
    ).properties(title="Prefix cache: cold against warm")


def gpu_telemetry(matrix: pd.DataFrame) -> alt.Chart:
    """GPU power and energy per output token against concurrency, one line per context (decode and capacity)."""
    if "gpu_power_w" not in matrix:
        return _empty("no GPU telemetry (NVML absent: CPU run)")
    d = matrix[matrix["workload"].isin(["decode", "capacity"]) & matrix["gpu_power_w"].notna()
               & (matrix["status"] == "valid")]
    if d.empty:
        return _empty("no GPU telemetry (NVML absent: CPU run)")
    d = d.assign(context=d["context_tokens"].astype(str) + " tok")
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


CHARTS = {
    "heatmap": ("Sustained decode heatmap", None),
    "throughput": ("Throughput against concurrency", throughput_concurrency),
    "ttft": ("TTFT against context", ttft_context),
    "spec": ("Speculative decoding sweep", spec_sweep),
    "prefix": ("Prefix cache cold against warm", prefix_cache),
    "gpu": ("GPU power and energy per token", gpu_telemetry),
}


def has_data(name: str, matrix: pd.DataFrame) -> bool:
    valid = matrix[matrix["status"] == "valid"]
    if name == "heatmap":
        return bool((matrix["workload"] == "decode").any())
    if name == "throughput":
        return bool(valid["workload"].isin(["decode", "capacity"]).any())
    if name == "ttft":
        return bool(valid["workload"].isin(["prefill", "latency"]).any())
    if name == "spec":
        return bool((valid.groupby("cell_id")["spec_tokens"].nunique() > 1).any())
    if name == "prefix":
        return bool((matrix["workload"] == "prefix_cache").any())
    if name == "gpu":
        return "gpu_power_w" in matrix and bool(matrix["gpu_power_w"].notna().any())
    return False


def save(chart: alt.Chart, html: str | Path, png: str | Path) -> None:
    chart.save(str(html))
    chart.save(str(png), scale_factor=2)


CHARTS["heatmap"] = ("Sustained decode heatmap", decode_heatmap)
