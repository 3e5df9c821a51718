"""When a decode cell has measured enough: intervals, the samples a percentile needs, and a sequential rule whose
repeated looks keep their error rate (docs/decisions/0028-precision-instead-of-fixed-time.md).

- A **rate over a window** (output tok/s of a steady decode window) is a time series, not independent samples:
  its interval comes from *non-overlapping batch means* (the window cut into equal batches, each batch's rate a
  sample; Law and Kelton, "Simulation Modeling and Analysis", the method of batch means), with Student's t over
  the batches.
- A cell's **repeats** are more windows of the same cell: each adds its batch means to the interval (a window
  at another level widens it; their spread is also judged by the CV rule, ``stability.max_cv``).
- A **percentile** (p99 TTFT) has a distribution-free interval between two order statistics (the binomial
  ranks around n·q); with too few samples no such interval exists at the level asked, and
  :func:`samples_for_percentile` says how many it needs.
- **Looking repeatedly** inflates the chance that some look's interval misses: the rule looks on a fixed
  schedule (at most ``looks`` looks a window, ``repeats`` windows) and splits the error rate over all of them
  (Bonferroni: each look at level 1 - alpha / (looks x repeats)), so the chance that the interval the rule stops
  on misses the true value stays at most alpha (tests/test_precision.py measures it on streams with a known
  answer)"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core import settings


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution's CDF."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """Student's t quantile (bisection on :func:`t_cdf`, to 1e-10)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must be in (0, 1), not {p}")
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10:
            break
    return (lo + hi) / 2.0


def mean_interval(values: Sequence[float], level: float) -> tuple[float, float] | None:
    """The mean's two-sided interval at ``level`` by Student's t; None with fewer than two values."""
    v = [float(x) for x in values]
    if len(v) < 2:
        return None
    mean = sum(v) / len(v)
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1))
    half = t_quantile(1.0 - (1.0 - level) / 2.0, len(v) - 1) * sd / math.sqrt(len(v))
    return mean - half, mean + half


def batch_means(times: Sequence[float], amounts: Sequence[float], start: float, end: float,
                batches: int) -> list[float]:
    """The rate (amount per second) of each of ``batches`` equal slices of [start, end): a window's tokens, each
    counted in the slice its arrival falls in."""
    if end <= start or batches < 1:
        return []
    width = (end - start) / batches
    sums = [0.0] * batches
    for t, a in zip(times, amounts):
        if start <= t < end:
            sums[min(int((t - start) / width), batches - 1)] += a
    return [s / width for s in sums]


def relative_half_width(interval: tuple[float, float] | None) -> float | None:
    """Half the interval's width over its midpoint (the precision target's measure); None without an interval
    or around zero."""
    if interval is None:
        return None
    mid = (interval[0] + interval[1]) / 2.0
    return (interval[1] - interval[0]) / 2.0 / abs(mid) if mid else None


def percentile_ranks(n: int, q: float, level: float) -> tuple[int, int] | None:
    """The 1-based ranks (lo, hi) of the order statistics that bound the q-quantile of n samples with two-sided
    coverage at least ``level`` (binomial, distribution-free), or None where n is too few for it."""
    if n < 1:
        return None
    alpha = (1.0 - level) / 2.0
    # the rank-th smallest sample is at or below the true quantile with probability P(Binomial(n, q) >= rank)
    log_q, log_p = math.log(q), math.log1p(-q)
    cdf, below = [], 0.0
    for k in range(n + 1):
        below += math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_q
                          + (n - k) * log_p)
        cdf.append(below)  # cdf[k] = P(X <= k)
    lo = next((r for r in range(n, 0, -1) if cdf[r - 1] <= alpha), None)  # P(X <= r-1) <= alpha
    hi = next((r for r in range(1, n + 1) if cdf[r - 1] >= 1.0 - alpha), None)  # P(X <= r-1) >= 1 - alpha
    if lo is None or hi is None:
        return None
    return lo, hi


def samples_for_percentile(q: float, level: float, limit: int = 100_000) -> int:
    """The fewest samples for which :func:`percentile_ranks` gives an interval of the q-quantile at ``level``."""
    for n in range(1, limit + 1):
        if percentile_ranks(n, q, level) is not None:
            return n
    raise ValueError(f"more than {limit} samples for the {q} quantile at level {level}")


# a decode window's rate interval: from this many batch means of its steady part
BATCHES = 10
# why a cell stopped measuring (its result's ``precision_stop``); the last three are Unstable where the rule is on
PRECISE, FIXED, MAX_WINDOW, MAX_REPEATS, TOO_FEW = "precise", "fixed", "max_window", "max_repeats", "too_few_requests"
UNMET = (MAX_WINDOW, MAX_REPEATS, TOO_FEW)


@dataclass(frozen=True)
class Precision:
    """A sustained-decode cell's stopping rule (the experiment's ``precision:``, a block's own keys over it; keys
    and defaults: the schema). The longest window is the block's ``duration_s`` and the most repeats its
    ``repeats``. A cell is one sequence of windows (its repeats): at each look, output tok/s's interval comes from
    the batch means of every window so far (:data:`BATCHES` a window), and the first look within ``output_tok_s``
    of its middle (relative half-width) ends the cell, once it has ``min_repeats`` windows; with ``percentile``,
    the requests that TTFT percentile's distribution-free interval needs are part of the target. ``enabled: false``
    measures the fixed windows and repeats (a published method's) and still reports the precision they reached."""

    enabled: bool
    output_tok_s: float
    percentile: float | None
    alpha: float
    looks: int
    min_window_s: float
    min_repeats: int

    @classmethod
    def of(cls, given: dict[str, Any] | None) -> Precision:
        """From ``precision:`` keys (valid against the schema), the absent ones at the schema's defaults."""
        return cls(**settings.section_defaults("precision", given))

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def level(self, repeats: int) -> float:
        """Each look's level in a cell of at most ``repeats`` windows: alpha split over all the looks it may make
        (Bonferroni); the rule off looks once, at the end, at 1 - alpha."""
        return 1.0 - self.alpha / (self.looks * repeats) if self.enabled else 1.0 - self.alpha

    def window_looks(self, duration_s: float) -> list[float]:
        """The seconds of steady state at which a window is looked at: ``min_window_s``, then evenly to the
        longest window (at most ``looks`` looks)."""
        lo = min(self.min_window_s, duration_s)
        if self.looks <= 1 or duration_s <= lo:
            return [duration_s]
        step = (duration_s - lo) / (self.looks - 1)
        return [lo + k * step for k in range(self.looks)]

    def samples_needed(self, repeats: int) -> int | None:
        """The requests (TTFTs) the percentile's interval needs at each look's level; None without a percentile."""
        return None if self.percentile is None else samples_for_percentile(self.percentile / 100.0,
                                                                           self.level(repeats))


def window_look(records: Sequence[Any], t_steady: float | None, t_at: float, rule: Precision, repeats: int,
                earlier: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The cell's precision at ``t_at`` (seconds since this window's start): output tok/s's interval from the batch
    means of this window's steady part so far (from ``t_steady``; the tokens as they arrived) and of the cell's
    ``earlier`` windows (their :func:`window_figures`), the requests with a first token, and whether the target is
    met. ``records``: this window's requests (``chunk_times``, ``chunk_tokens``, ``first_token``); ``repeats``:
    the most windows the cell has (each look's level)."""
    batches = [b for w in earlier for b in w.get("precision_batches") or []]
    ttfts = int(earlier[-1].get("precision_ttft_samples") or 0) if earlier else 0  # the cell's so far
    if t_steady is not None and t_at > t_steady:
        times, amounts = [], []
        for r in records:
            times += r.chunk_times
            amounts += r.chunk_tokens
        batches += batch_means(times, amounts, t_steady, t_at, BATCHES)
        ttfts += sum(1 for r in records if r.first_token is not None and r.first_token <= t_at)
    own = batches[len(batches) - BATCHES:] if t_steady is not None and t_at > t_steady else []
    ci = mean_interval(batches, rule.level(repeats))
    rel = relative_half_width(ci)
    need = rule.samples_needed(repeats)
    return {"at_s": t_at, "interval": ci, "relative_half_width": rel, "ttft_samples": ttfts, "batches": own,
            "precise": rel is not None and rel <= rule.output_tok_s and (need is None or ttfts >= need)}


def window_figures(rule: Precision, final: dict[str, Any], looks: int) -> dict[str, Any]:
    """A window's figures of the cell's precision (a decode repeat's result keys): the relative half-width the
    cell reached with it, the looks made, this window's batch means and first tokens (the next window pools
    them), and the target."""
    return {"precision_reached": final["relative_half_width"], "precision_met": final["precise"],
            "precision_looks": looks, "precision_batches": [round(b, 3) for b in final["batches"]],
            # the cell's requests with a first token so far, this window's included
            "precision_ttft_samples": final["ttft_samples"],
            "precision_target": rule.output_tok_s if rule.enabled else None}


def cell_stop(rule: Precision, windows: Sequence[dict[str, Any]], max_repeats: int) -> dict[str, Any]:
    """After each window of a cell (``windows``: their figures so far): stop or measure again, and why. The cell's
    precision is its last look's (every window so far pooled)."""
    n, last = len(windows), windows[-1]
    out = {"precision_reached": last["precision_reached"], "repeats_measured": n,
           "precision_target": last["precision_target"], "precision_ttft_samples": last["precision_ttft_samples"]}
    if rule.enabled and last["precision_met"] and n >= rule.min_repeats:
        return {**out, "stop": True, "precision_stop": PRECISE}
    if n < max_repeats:
        return {**out, "stop": False, "precision_stop": None}
    if not rule.enabled:
        why = FIXED
    elif last["precision_reached"] is None or last["precision_reached"] <= rule.output_tok_s:
        why = TOO_FEW  # no steady part, or the percentile's requests short
    else:
        why = MAX_WINDOW if max_repeats == 1 else MAX_REPEATS
    return {**out, "stop": True, "precision_stop": why}


def looks_at(t_steady: float, duration_s: float, rule: Precision) -> list[float]:
    """The window's looks (seconds since its start) that fall before its end: :meth:`Precision.window_looks`
    from steady state."""
    return [t_steady + w for w in rule.window_looks(duration_s) if t_steady + w < duration_s]


def after_the_fact(windows: Sequence[tuple[Sequence[Any], float | None]], duration_s: float,
                   rule: Precision) -> tuple[dict[str, Any], int]:
    """Where the rule would have ended a cell already measured (``windows``: each repeat's requests and steady
    start, in order; at most that many repeats): (the look it stops at, else the last window's end; the windows it
    used). The live rule (``workloads.decode``, ``jobs.cells``) makes the same looks as the windows run."""
    earlier: list[dict[str, Any]] = []
    repeats = len(windows)
    for n, (records, t_steady) in enumerate(windows, 1):
        if rule.enabled and n >= rule.min_repeats and t_steady is not None:
            for at in looks_at(t_steady, duration_s, rule):
                look = window_look(records, t_steady, at, rule, repeats, earlier)
                if look["precise"]:
                    return look, n
        final = window_look(records, t_steady, duration_s, rule, repeats, earlier)
        if rule.enabled and final["precise"] and n >= rule.min_repeats:
            return final, n
        earlier.append(window_figures(rule, final, 0))
    return final, repeats


def unmet(result: dict[str, Any], duration_s: float | None) -> str | None:
    """Why a cell whose stopping rule was on ended without its precision (it is Unstable for it), else None."""
    stop, target, rel = result.get("precision_stop"), result.get("precision_target"), result.get("precision_reached")
    if target is None or stop not in UNMET:
        return None
    reached = "no interval" if rel is None else f"±{rel:.1%}"
    where = {MAX_WINDOW: f"after its longest window ({duration_s:g} s)",
             MAX_REPEATS: f"after its last repeat ({result.get('repeats_measured')} windows of at most "
                          f"{duration_s:g} s)",
             TOO_FEW: "with too few requests (no steady part, or fewer than its latency percentile needs: "
                      f"{result.get('precision_ttft_samples')} with a first token)"}[stop]
    return f"output tok/s {reached} {where}, target ±{target:.1%}"
