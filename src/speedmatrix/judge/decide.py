"""From matrix to decision: the Pareto frontier, the best config per target, the best sweep point.

Everything here reads the matrix (``matrix.parquet``) and the per-target table (``decisions.parquet``,
speedmatrix.measure.slo): nothing measures, and the same functions serve one run (the report) and several
(``speedmatrix pareto RUN...``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .. import workloads
from ..core.status import USABLE

# cells whose figures are measurements a decision can rest on
# tok/s a user gets: the server's output rate shared by the requests in flight (total_tok_s over the
# average number active). Not a request's own rate between its streamed events: on a server that delivers
# in bursts (the CPU default) that span is near zero and the rate meaningless (docs/fidelity.md, section 5)
X_COL = "tok_s_per_user"
Y_COL = "tok_s_per_gpu"  # output tok/s of the server over its GPUs (the whole server on a CPU runtime)


def per_user(total_tok_s: pd.Series, active: pd.Series) -> pd.Series:
    """Output tok/s each request in flight got on average (the cell's rate over its mean active requests)."""
    a = pd.to_numeric(active, errors="coerce")
    return total_tok_s / a.where(a > 0)


def per_gpu(total_tok_s: pd.Series, gpus: pd.Series) -> pd.Series:
    """Output tok/s per GPU; on a CPU runtime (no GPU) the whole server's."""
    g = pd.to_numeric(gpus, errors="coerce")
    return total_tok_s / g.where(g > 0, 1.0)


def per_unit(frame: pd.DataFrame) -> str:
    """What ``tok_s_per_gpu`` is per: "GPU" where any server config has GPUs, else "server" (the CPU)."""
    return "GPU" if (pd.to_numeric(frame.get("gpus"), errors="coerce") > 0).any() else "server"


def frontier_mask(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """True for the points no other point beats on both axes (at least as high on both, higher on one)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.ones(len(x), dtype=bool)
    for i in range(len(x)):
        dominated = (x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i]))
        keep[i] = not dominated.any()
    return keep


def pareto_points(matrix: pd.DataFrame, run: str | None = None) -> pd.DataFrame:
    """The throughput cells (capacity, decode) a frontier is drawn from, with both axes and a name."""
    kinds = [n for n in workloads.names() if workloads.get(n).throughput]
    m = matrix[matrix["workload"].isin(kinds) & matrix["status"].isin(USABLE)].copy()
    if Y_COL not in m:
        m[Y_COL] = per_gpu(m["total_tok_s"], m.get("gpus", pd.Series(index=m.index, dtype=float)))
    if X_COL not in m:
        m[X_COL] = per_user(m["total_tok_s"], m["avg_active_requests"])
    m = m[m[X_COL].notna() & m[Y_COL].notna() & (m[X_COL] > 0) & (m[Y_COL] > 0)]
    m["run"] = run if run is not None else m["experiment"]
    m["point"] = m["server_id"] + " · " + m["cell_id"]
    return m


def frontier(points: pd.DataFrame) -> pd.DataFrame:
    """``points`` with ``on_frontier``; the frontier's points sorted by tok/s per user."""
    out = points.copy()
    out["on_frontier"] = frontier_mask(out[X_COL].to_numpy(), out[Y_COL].to_numpy()) if len(out) else []
    return out.sort_values(X_COL)


def best_configs(decisions: pd.DataFrame) -> pd.DataFrame:
    """For each target, kind and context: the server config with the highest goodput among the cells where
    the target holds (at which concurrency), its interval, and the runner-up config."""
    cols = ["slo", "slo_definition", "workload", "context_tokens", "best_server", "best_cell", "concurrency",
            "goodput_tok_s", "goodput_tok_s_ci_low", "goodput_tok_s_ci_high", "runner_up_server",
            "runner_up_concurrency", "runner_up_goodput_tok_s", "margin_pct", "configs_meeting", "configs_tried"]
    if decisions is None or decisions.empty:
        return pd.DataFrame(columns=cols)
    kinds = [n for n in workloads.names() if workloads.get(n).throughput or workloads.get(n).searches]
    d = decisions[decisions["workload"].isin(kinds) & decisions["status"].isin(USABLE)]
    rows = []
    for (name, kind, ctx), g in d.groupby(["slo", "workload", "context_tokens"], sort=True):
        ok = g[g["slo_met"].eq(True) & g["goodput_tok_s"].notna()]
        best_per_server = (ok.sort_values("goodput_tok_s", ascending=False).groupby("server_id", sort=False)
                           .head(1))
        row: dict[str, Any] = {"slo": name, "slo_definition": g["slo_definition"].iloc[0], "workload": kind,
                               "context_tokens": int(ctx),
                               "configs_meeting": int(best_per_server["server_id"].nunique()),
                               "configs_tried": int(g["server_id"].nunique())}
        if len(best_per_server):
            b = best_per_server.iloc[0]
            row.update(best_server=b["server_id"], best_cell=b["cell_id"], concurrency=int(b["concurrency"]),
                       goodput_tok_s=b["goodput_tok_s"], goodput_tok_s_ci_low=b.get("goodput_tok_s_ci_low"),
                       goodput_tok_s_ci_high=b.get("goodput_tok_s_ci_high"))
            if len(best_per_server) > 1:
                r = best_per_server.iloc[1]
                row.update(runner_up_server=r["server_id"], runner_up_concurrency=int(r["concurrency"]),
                           runner_up_goodput_tok_s=r["goodput_tok_s"],
                           margin_pct=(b["goodput_tok_s"] / r["goodput_tok_s"] - 1) * 100
                           if r["goodput_tok_s"] else None)
        rows.append(row)
    return pd.DataFrame(rows, columns=cols)


def best_sweep_points(matrix: pd.DataFrame) -> pd.DataFrame:
    """For each sweep, kind, context and concurrency: the sweep point with the highest output tok/s
    (seed 000's question: how many speculative tokens at which concurrency), with its interval and
    the runner-up point."""
    cols = ["sweep", "workload", "context_tokens", "concurrency", "best_point", "best_server", "tok_s",
            "tok_s_ci_low", "tok_s_ci_high", "runner_up_point", "runner_up_tok_s", "margin_pct", "points",
            "overlapping"]
    if "sweep" not in matrix:
        return pd.DataFrame(columns=cols)
    m = matrix[matrix["sweep"].notna() & matrix["status"].isin(USABLE) & matrix["total_tok_s"].notna()]
    rows = []
    for (sweep, kind, ctx, conc), g in m.groupby(["sweep", "workload", "context_tokens", "concurrency"], sort=True):
        if workloads.get(kind).searches or g["server_id"].nunique() < 2:
            continue
        g = g.sort_values("total_tok_s", ascending=False)
        b, r = g.iloc[0], g.iloc[1]
        lo, hi = b.get("total_tok_s_ci_low"), r.get("total_tok_s_ci_high")
        rows.append({"sweep": sweep, "workload": kind, "context_tokens": int(ctx), "concurrency": int(conc),
                     "best_point": b["sweep_point"], "best_server": b["server_id"], "tok_s": b["total_tok_s"],
                     "tok_s_ci_low": lo, "tok_s_ci_high": b.get("total_tok_s_ci_high"),
                     "runner_up_point": r["sweep_point"], "runner_up_tok_s": r["total_tok_s"],
                     "margin_pct": (b["total_tok_s"] / r["total_tok_s"] - 1) * 100 if r["total_tok_s"] else None,
                     "points": int(len(g)),
                     # the two intervals overlap: the repeats cannot tell the best from the runner-up
                     "overlapping": bool(pd.notna(lo) and pd.notna(hi) and lo <= hi)})
    return pd.DataFrame(rows, columns=cols)
