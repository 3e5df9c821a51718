#!/usr/bin/env python3
"""Where a precision rule would have stopped the recorded decode windows: applied after the fact to the runs in
docs/results/ (no GPU needed, nothing measured again).

    .venv/bin/python bench/precision_after.py [--target 0.02] [--out docs/results/precision-after-the-fact]

For each decode cell's repeat in each run's requests.parquet: the window is the span of its requests' tokens (the
first token's arrival to the last request's end); a request's tokens after the first are spread evenly between its
first token and its end (the table keeps no per-event times). The rule (``speedmatrix.measure.precision.Rule``)
looks at 20 %, 30 % ... 100 % of the window: the rate's interval from ten batch means of the window so far, each
look at level 1 - alpha / looks; it stops at the first look whose interval is within ``--target`` of its middle.
Each row: where it stopped, the rate there against the full window's (and whether it lies inside the full
window's own 95 % interval), and the share of the window it would have saved. Writes ``cells.csv`` (every repeat)
and ``summary.csv`` (per run).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from speedmatrix.measure import precision  # noqa: E402

# the recorded runs with decode windows: GPU (H200 and H100) and the CPU default's trained pair
RUNS = {
    "h200-round4/vllm-0.25.1": "H200",
    "h200-round4/vllm-0.26.0": "H200",
    "h200-round4/vllm-0.25.1-h100": "H100",
    "h200-round4/vllm-0.25.1-h100-again": "H100",
    "h200-round4/vllm-0.25.1-ngram-h100": "H100",
    "h200-round4/ngram-h100": "H100",
    "h200-round4/ngram-vllm-0.26.0-h100": "H100",
    "h200-round4/31b-shape-vllm-0.25.1-h100": "H100",
    "h200-round4/31b-shape-vllm-0.26.0-h100": "H100",
    "h200-gemma4-31b-shape": "H200",
    "h200-bundle-install": "H200",
    "h200x2-pool/serial-warm": "H200",
    "tiny-cpu-trained": "CPU",
}
LOOKS = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
BATCHES = 10


def token_times(g: pd.DataFrame, step: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Every request's tokens as (arrival time, tokens): its first at start + TTFT, the rest evenly to its end."""
    times, amounts = [], []
    for r in g.itertuples():
        first = r.start_s + r.ttft_ms / 1000.0
        n = int(r.output_tokens)
        if n < 1 or r.end_s is None:
            continue
        times.append(first)
        amounts.append(1.0)
        if n > 1:
            times += list(np.linspace(first, r.end_s, n)[1:])
            amounts += [1.0] * (n - 1)
    return np.asarray(times), np.asarray(amounts)


def one_window(g: pd.DataFrame, target: float, alpha: float) -> dict | None:
    times, amounts = token_times(g)
    if len(times) < BATCHES * 2:
        return None
    t0, t1 = float(times.min()), float(times.max())
    span = t1 - t0
    full_rate = float(amounts.sum() / span)
    full_ci = precision.mean_interval(precision.batch_means(times, amounts, t0, t1 + 1e-9, BATCHES), 1 - alpha)
    level = 1 - alpha / len(LOOKS)
    stop, reason = 1.0, "max_reached"
    for f in LOOKS:
        t = t0 + f * span
        ci = precision.mean_interval(precision.batch_means(times, amounts, t0, t, BATCHES), level)
        rel = precision.relative_half_width(ci)
        if rel is not None and rel <= target:
            stop, reason = f, "precise"
            break
    t = t0 + stop * span
    sel = times < t
    rate = float(amounts[sel].sum() / (t - t0))
    return {"window_s": round(span, 3), "stopped_at": stop, "reason": reason, "rate_at_stop": round(rate, 2),
            "full_rate": round(full_rate, 2), "full_ci_low": round(full_ci[0], 2), "full_ci_high": round(full_ci[1], 2),
            "inside_full_interval": bool(full_ci[0] <= rate <= full_ci[1]), "saved_share": round(1 - stop, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=float, default=0.02, help="the relative half-width to stop at (0.02: ±2 %%)")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--out", type=Path, default=REPO / "docs/results/precision-after-the-fact")
    ns = ap.parse_args()
    rows = []
    for run, device in RUNS.items():
        path = REPO / "docs/results" / run / "requests.parquet"
        if not path.exists():
            continue
        reqs = pd.read_parquet(path, columns=["server_id", "cell_id", "repeat", "start_s", "ttft_ms", "end_s",
                                              "output_tokens", "error"])
        reqs = reqs[reqs["cell_id"].str.startswith("decode-") & reqs["error"].isna() & reqs["ttft_ms"].notna()]
        for (sid, cid, rep), g in reqs.groupby(["server_id", "cell_id", reqs["repeat"].fillna(0)]):
            got = one_window(g, ns.target, ns.alpha)
            if got:
                rows.append({"run": run, "device": device, "server_id": sid, "cell_id": cid, "repeat": int(rep),
                             **got})
    cells = pd.DataFrame(rows)
    ns.out.mkdir(parents=True, exist_ok=True)
    cells.to_csv(ns.out / "cells.csv", index=False)
    cells["saved_s"] = cells["window_s"] * cells["saved_share"]
    summary = cells.groupby(["device", "run"]).agg(
        windows=("cell_id", "size"), stopped_precise=("reason", lambda s: int((s == "precise").sum())),
        inside_full_interval=("inside_full_interval", "sum"), window_s=("window_s", "sum"),
        saved_s=("saved_s", "sum")).reset_index()
    # each device's runs together
    for device, g in summary.groupby("device"):
        summary.loc[len(summary)] = {"device": device, "run": "all", **g.drop(columns=["device", "run"]).sum()}
    counts = ["windows", "stopped_precise", "inside_full_interval"]
    summary[counts] = summary[counts].astype(int)
    summary[["window_s", "saved_s"]] = summary[["window_s", "saved_s"]].round(1)
    # the measurement time the rule would have saved, over the time measured
    summary["saved_share_of_time"] = (summary["saved_s"] / summary["window_s"]).round(3)
    summary.to_csv(ns.out / "summary.csv", index=False)
    print(summary.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
