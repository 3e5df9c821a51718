#!/usr/bin/env python3
"""Where the workflow's precision rule would have stopped the recorded decode windows: applied after the fact to
the runs in docs/results/ (no GPU needed, nothing measured again).

    .venv/bin/python bench/precision_after.py [--targets 0.02 0.05 0.1] [--out docs/results/precision-after-the-fact]

For each decode cell's repeat in each run's requests.parquet: the window is the span of its requests' tokens (the
first token's arrival to the last request's end); a request's tokens after the first are spread evenly between its
first token and its end (the table keeps no per-event times). The rule is the workflow's
(``speedmatrix.measure.precision.after_the_fact``, the looks a live window makes): its looks from 20 % of the
window evenly to its end (nine looks: ``min_window_s`` is a fifth of the window), output tok/s's interval from
ten batch means of the window so far, each look at level 1 - alpha / looks (one window: a cell of one repeat); it
stops at the first look whose
interval is within the target of its middle. Each row: where it stopped, the rate there against the full
window's (and whether it lies inside the full window's own 95 % interval), and the share of the window it would
have saved, and whether the rate there is within the target of the full window's (the rule's promise), for each
target. Writes ``cells.csv.gz`` (every repeat, every target; gzipped) and ``summary.csv`` (per run and
target).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

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
LOOKS = 9


def token_times(g: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
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
    if len(times) < precision.BATCHES * 2:
        return None
    t0, t1 = float(times.min()), float(times.max())
    span = t1 - t0
    full_rate = float(amounts.sum() / span)
    full_ci = precision.mean_interval(precision.batch_means(times, amounts, t0, t1 + 1e-9, precision.BATCHES),
                                      1 - alpha)
    rule = precision.Precision.of({"output_tok_s": target, "alpha": alpha, "looks": LOOKS, "min_window_s": span / 5})
    # one record of the window's tokens, times from its start (the rule reads chunk_times and chunk_tokens)
    window = SimpleNamespace(chunk_times=list(times - t0), chunk_tokens=list(amounts), first_token=0.0)
    stop, _ = precision.after_the_fact([([window], 0.0)], span + 1e-9, rule)
    at = min(stop["at_s"], span)
    sel = times < t0 + at
    rate = float(amounts[sel].sum() / at)
    return {"target": target, "window_s": round(span, 3), "stopped_at": round(at / span, 2),
            "reason": "precise" if stop["precise"] else "max_reached", "rate_at_stop": round(rate, 2),
            "full_rate": round(full_rate, 2), "full_ci_low": round(full_ci[0], 2), "full_ci_high": round(full_ci[1], 2),
            "inside_full_interval": bool(full_ci[0] <= rate <= full_ci[1]),
            # the rule's promise: the figure where it stopped is within the target of the full window's
            "within_target_of_full": bool(abs(rate / full_rate - 1) <= target), "saved_share": round(1 - at / span, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", type=float, nargs="+", default=[0.02, 0.05, 0.1],
                    help="the relative half-widths to stop at (0.02: ±2 %%), each applied to every window")
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
            for target in ns.targets:
                got = one_window(g, target, ns.alpha)
                if got:
                    rows.append({"run": run, "device": device, "server_id": sid, "cell_id": cid, "repeat": int(rep),
                                 **got})
    cells = pd.DataFrame(rows)
    ns.out.mkdir(parents=True, exist_ok=True)
    cells.to_csv(ns.out / "cells.csv.gz", index=False, compression={"method": "gzip", "mtime": 0})
    cells["saved_s"] = cells["window_s"] * cells["saved_share"]
    summary = cells.groupby(["target", "device", "run"]).agg(
        windows=("cell_id", "size"), stopped_precise=("reason", lambda s: int((s == "precise").sum())),
        inside_full_interval=("inside_full_interval", "sum"), within_target_of_full=("within_target_of_full", "sum"),
        window_s=("window_s", "sum"),
        saved_s=("saved_s", "sum")).reset_index()
    # each device's runs together, per target
    for (target, device), g in summary.groupby(["target", "device"]):
        summary.loc[len(summary)] = {"target": target, "device": device, "run": "all",
                                     **g.drop(columns=["target", "device", "run"]).sum()}
    counts = ["windows", "stopped_precise", "inside_full_interval", "within_target_of_full"]
    summary[counts] = summary[counts].astype(int)
    summary[["window_s", "saved_s"]] = summary[["window_s", "saved_s"]].round(1)
    # the measurement time the rule would have saved, over the time measured
    summary["saved_share_of_time"] = (summary["saved_s"] / summary["window_s"]).round(3)
    summary.to_csv(ns.out / "summary.csv", index=False)
    print(summary.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
