"""Latency targets (SLOs): which requests of a cell meet one, the cell's goodput, and whether it holds.

A target is a named set of limits on a request's TTFT, TPOT (time per output token after the first,
``(e2e - ttft) / (tokens - 1)``, as vLLM and MLPerf define it) and end-to-end latency, at a percentile.
Two readings of one target, both kept:

* **per request** (vLLM's ``--goodput``): a request meets the target when every limit it can be judged
  on holds; the cell's *attainment* is the share of judged requests that met it, its *goodput* the
  requests/s and output tok/s of those requests over the cell's measured time;
* **per cell** (MLPerf's server scenario): the target *holds* when, for each limit, the percentile of
  that figure over the cell's requests is within it (failed requests count as infinitely late).

A request cut at a decode window's end is judged on what it had: its TTFT and its TPOT so far; its
end-to-end latency only if it had already run past the limit. A request that failed misses. Nothing
here measures: a new or changed target is derived again from ``requests.parquet``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..core.errors import ConfigError
from . import stats
from .stats import nearest_rank

LIMITS = ("ttft_ms", "tpot_ms", "e2e_ms")
LIMIT_NAMES = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2e_ms": "E2E"}

# MLPerf Inference, LLM benchmarks, Server scenario: TTFT and TPOT limits at the 99th percentile
# (mlcommons/inference, loadgen/mlperf.conf: <model>.Server.ttft_latency / tpot_latency, in ms;
# *.Server.target_latency_percentile = 99)
MLPERF_SOURCE = "MLPerf Inference loadgen/mlperf.conf (mlcommons/inference), Server scenario"
PRESETS: dict[str, dict[str, float]] = {
    "mlperf-llama2-70b": {"ttft_ms": 2000, "tpot_ms": 200},
    "mlperf-llama2-70b-interactive": {"ttft_ms": 450, "tpot_ms": 40},
    "mlperf-mixtral-8x7b": {"ttft_ms": 2000, "tpot_ms": 200},
    "mlperf-llama3.1-405b": {"ttft_ms": 6000, "tpot_ms": 175},
    "mlperf-llama3.1-405b-interactive": {"ttft_ms": 4500, "tpot_ms": 80},
    "mlperf-llama3.1-8b": {"ttft_ms": 2000, "tpot_ms": 100},
    "mlperf-llama3.1-8b-interactive": {"ttft_ms": 500, "tpot_ms": 30},
    "mlperf-deepseek-r1": {"ttft_ms": 2000, "tpot_ms": 80},
    "mlperf-deepseek-r1-interactive": {"ttft_ms": 1500, "tpot_ms": 15},
}
PRESET_PERCENTILE = 99.0


@dataclass(frozen=True)
class Target:
    name: str
    percentile: float = PRESET_PERCENTILE
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    preset: str | None = None

    def limits(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in LIMITS if getattr(self, k) is not None}

    def describe(self) -> str:
        """``p99: TTFT ≤ 500 ms, TPOT ≤ 30 ms`` (and the preset it came from)."""
        parts = ", ".join(f"{LIMIT_NAMES[k]} ≤ {v:g} ms" for k, v in self.limits().items())
        text = f"p{self.percentile:g}: {parts}"
        return f"{text} ({self.preset})" if self.preset else text

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def target(name: str, spec: dict[str, Any], source: str = "slos") -> Target:
    """One target from its block: limits and a percentile, or ``preset:`` (with overrides)."""
    spec = dict(spec)
    preset = spec.pop("preset", None)
    base: dict[str, Any] = {}
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"{source}: key 'slos.{name}.preset': unknown preset {preset!r} "
                              f"(known: {', '.join(PRESETS)})")
        base = {**PRESETS[preset], "percentile": PRESET_PERCENTILE}
    merged = {**base, **spec}
    if not any(merged.get(k) is not None for k in LIMITS):
        raise ConfigError(f"{source}: key 'slos.{name}': a target needs at least one of {', '.join(LIMITS)} "
                          "or a preset")
    return Target(name=name, percentile=float(merged.get("percentile", PRESET_PERCENTILE)), preset=preset,
                  **{k: (float(merged[k]) if merged.get(k) is not None else None) for k in LIMITS})


def targets(raw: dict[str, Any], source: str = "slos") -> list[Target]:
    """The experiment's ``slos:`` block, in its order (the first is the matrix's own)."""
    return [target(name, spec or {}, source) for name, spec in (raw or {}).items()]


# ---- per request ----------------------------------------------------------------------------------

# the columns of a requests table (``records.COLUMNS``) a target is judged on
READS = ("start_s", "end_s", "ttft_ms", "output_tokens", "error", "cut_at_window_end")


def request_figures(reqs: pd.DataFrame) -> pd.DataFrame:
    """Per request: ttft_ms, tpot_ms, e2e_ms (completed requests), elapsed_ms, and whether it completed
    or failed, from a requests table (its columns ``READS``)."""
    elapsed = (reqs["end_s"].astype(float) - reqs["start_s"].astype(float)) * 1000.0
    ttft = reqs["ttft_ms"].astype(float)
    tokens = reqs["output_tokens"].astype(float)
    failed = reqs["error"].notna() & (reqs["error"].astype(str) != "")
    cut = reqs["cut_at_window_end"].fillna(False).astype(bool)
    completed = ~failed & ~cut & reqs["end_s"].notna()
    tpot = pd.Series(stats.tpot_ms(reqs["start_s"], reqs["end_s"], ttft, tokens), index=reqs.index)
    return pd.DataFrame({
        "ttft_ms": ttft,
        "tpot_ms": tpot,
        "e2e_ms": elapsed.where(completed),
        "elapsed_ms": elapsed,
        "output_tokens": tokens,
        "completed": completed,
        "failed": failed,
    }, index=reqs.index)


def judge(fig: pd.DataFrame, t: Target) -> pd.Series:
    """Per request: True (met every limit), False (missed one, or failed), or None (cannot be judged yet:
    cut at the window's end before it could miss)."""
    out = pd.Series(True, index=fig.index, dtype=object)
    unknown = pd.Series(False, index=fig.index)
    miss = fig["failed"].copy()
    for key, lim in t.limits().items():
        value = fig[key]
        known = value.notna()
        miss |= known & (value > lim)
        if key == "tpot_ms":
            continue  # fewer than two tokens: no time per output token, nothing to miss (as vLLM)
        # no figure: a cut request that ran past the limit missed it; otherwise it cannot be judged
        late = ~known & fig["elapsed_ms"].notna() & (fig["elapsed_ms"] > lim)
        miss |= late
        unknown |= ~known & ~late & ~fig["failed"]
    out[unknown] = None
    out[miss] = False
    return out


def _percentile_holds(fig: pd.DataFrame, t: Target) -> tuple[bool | None, dict[str, float | None]]:
    """MLPerf's reading: the percentile (nearest rank) of each limited figure within its limit (failures
    count as infinitely late; a cut request that ran past a limit counts as past it)."""
    pcts: dict[str, float | None] = {}
    holds = True
    for key, lim in t.limits().items():
        value = fig[key].copy()
        if key != "tpot_ms":
            late = value.isna() & fig["elapsed_ms"].notna() & (fig["elapsed_ms"] > lim)
            value[late] = math.inf
        value[fig["failed"]] = math.inf
        vals = value.dropna().to_numpy(dtype=float)
        if not len(vals):
            pcts[key] = None
            if key != "tpot_ms":
                holds = False
            continue
        # nearest rank (no interpolation: an infinitely late request stays infinitely late)
        pcts[key] = nearest_rank(vals, t.percentile)
        holds &= pcts[key] <= lim
    return (holds if len(fig) else None), pcts


def evaluate(reqs: pd.DataFrame, t: Target, window_s: float | None) -> dict[str, Any]:
    """One target over one set of requests measured in ``window_s`` seconds."""
    fig = request_figures(reqs)
    verdict = judge(fig, t)
    judged = verdict.notna()
    met = verdict.eq(True)
    holds, pcts = _percentile_holds(fig, t)
    ok_window = window_s is not None and window_s > 0
    return {
        "judged_requests": int(judged.sum()),
        "met_requests": int(met.sum()),
        "attainment": float(met.sum() / judged.sum()) if judged.sum() else None,
        "slo_met": holds,
        **{f"p_{k}": pcts.get(k) for k in LIMITS},
        "goodput_rps": float((met & fig["completed"]).sum() / window_s) if ok_window else None,
        "goodput_tok_s": float(fig["output_tokens"][met].sum() / window_s) if ok_window else None,
        # the share of the output tokens that came from requests that met the target (energy per goodput token)
        "goodput_token_share": (float(fig["output_tokens"][met].sum() / fig["output_tokens"].sum())
                                if fig["output_tokens"].sum() else None),
    }


def for_cell(reqs: pd.DataFrame, result: dict[str, Any], targets_: list[Target], phase: str | None = None,
             window_s: float | None = None) -> list[dict[str, Any]]:
    """Each target over one cell's requests (``phase``: only those of one pass or search step, measured in
    ``window_s``). Attainment and the percentile verdict pool the cell's repeats; goodput is the median
    of the repeats' with a 95 % interval (as the cell's other figures), or the whole cell's."""
    if phase is not None and "phase" in reqs:
        reqs = reqs[reqs["phase"] == phase]
    reps = result.get("repeat_figures") or []
    rows = []
    for t in targets_:
        row: dict[str, Any] = {"slo": t.name, "slo_definition": t.describe(), "percentile": t.percentile,
                               **{f"{k[:-3]}_limit_ms": getattr(t, k) for k in LIMITS}}
        row.update(evaluate(reqs, t, window_s if window_s is not None else result.get("measured_s")))
        row["goodput_tok_s_ci_low"] = row["goodput_tok_s_ci_high"] = None
        row["goodput_repeats"] = None
        if not phase and len(reps) > 1 and "repeat" in reqs:  # all requests, or a rate cell's counted ones
            per = [evaluate(reqs[reqs["repeat"] == k], t, r.get("measured_s"))["goodput_tok_s"]
                   for k, r in enumerate(reps, start=1)]
            per = [float(x) for x in per if x is not None]
            if per:
                row["goodput_tok_s"] = float(np.median(per))
                ci = stats.interval(per)["ci95"]
                if ci:
                    row["goodput_tok_s_ci_low"], row["goodput_tok_s_ci_high"] = ci
                row["goodput_repeats"] = per
        rows.append(row)
    return rows
