"""When a figure is precise enough to stop measuring it: intervals, the samples a percentile needs, and a
sequential rule whose repeated looks keep their error rate.

- A **rate over a window** (output tok/s of a steady decode window) is a time series, not independent samples:
  its interval comes from *non-overlapping batch means* (the window cut into equal batches, each batch's rate a
  sample; Law and Kelton, "Simulation Modeling and Analysis", the method of batch means), with Student's t over
  the batches.
- **Repeats** of a cell are independent: their mean's interval is Student's t over the repeats.
- A **percentile** (p99 TTFT) has a distribution-free interval between two order statistics (the binomial
  ranks around n·q); with too few samples no such interval exists at the level asked, and
  :func:`samples_for_percentile` says how many it needs.
- **Looking repeatedly** inflates the chance that some look's interval misses: the rule looks on a fixed
  schedule (at most ``looks`` looks) and splits the error rate over them (Bonferroni: each look at level
  1 - alpha / looks), so the chance that the interval the rule stops on misses the true value stays at most
  alpha (tests/test_precision.py measures it on streams with a known answer).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


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


@dataclass(frozen=True)
class Rule:
    """When to stop: the interval's relative half-width at most ``target`` (e.g. 0.02: ±2 %), at error rate
    ``alpha`` over at most ``looks`` looks (each look at level 1 - alpha / looks), never before ``min_n``
    samples; ``max_n`` samples end it without the precision."""

    target: float = 0.02
    alpha: float = 0.05
    looks: int = 8
    min_n: int = 3
    max_n: int = 20

    @property
    def level(self) -> float:
        """Each look's level: the error rate split over the looks (Bonferroni)."""
        return 1.0 - self.alpha / self.looks

    def schedule(self) -> list[int]:
        """The sample counts it looks at: ``min_n``, then evenly to ``max_n`` (at most ``looks`` looks)."""
        if self.max_n <= self.min_n:
            return [self.max_n]
        step = (self.max_n - self.min_n) / max(1, self.looks - 1)
        return sorted({min(self.max_n, round(self.min_n + k * step)) for k in range(self.looks)})

    def look(self, values: Sequence[float]) -> dict[str, Any]:
        """The rule's answer for the samples so far: stop or go on, why, and the interval it reached."""
        n = len(values)
        ci = mean_interval(values, self.level)
        rel = relative_half_width(ci)
        if n >= self.min_n and rel is not None and rel <= self.target:
            return {"stop": True, "reason": "precise", "n": n, "interval": ci, "relative_half_width": rel}
        if n >= self.max_n:
            return {"stop": True, "reason": "max_reached", "n": n, "interval": ci, "relative_half_width": rel}
        return {"stop": False, "reason": None, "n": n, "interval": ci, "relative_half_width": rel}


def run_sequentially(rule: Rule, draw) -> dict[str, Any]:
    """Draw samples (``draw()`` gives the next one) and look at the rule's schedule until it stops."""
    values: list[float] = []
    for n in rule.schedule():
        while len(values) < n:
            values.append(float(draw()))
        got = rule.look(values)
        if got["stop"]:
            return {**got, "values": values}
    return {**rule.look(values), "stop": True, "reason": "max_reached", "values": values}
