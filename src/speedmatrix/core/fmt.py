"""Numbers, contexts and statuses as the report prints them. Imports nothing of speedmatrix."""

from __future__ import annotations

import math
from typing import Any

from .status import LABELS

# A cell's status as a reader sees it; matrix.parquet keeps the key.
STATUS_LABEL = {str(s): label for s, label in LABELS.items()}


def missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def missing_list(values: Any) -> bool:
    """A list column read back from parquet: None, or an empty array."""
    return values is None or (not isinstance(values, str) and len(values) == 0)


def interval(low: Any, high: Any, show=None) -> str:
    """A 95 % interval: 394.2–430.4 (— when there is none). One whose low end was clipped at zero (two repeats
    far apart: Student's t reaches below it), or whose low end shows as zero, is "up to" its high end: a zero
    there is no figure."""
    show = show or num
    if missing(low) or missing(high):
        return "—"
    shown = show(low)
    zero = float(low) <= 0 or not any(ch in "123456789" for ch in shown)
    return f"up to {show(high)}" if zero else f"{shown}–{show(high)}"


def status(s: Any) -> str:
    return STATUS_LABEL.get(s, str(s))


def num(v: Any) -> str:
    """Like the seeds: 31.5K, 6,473.0, 95.7."""
    if missing(v):
        return "—"
    v = float(v)
    if abs(v) >= 10_000:
        return f"{v / 1000:.1f}K"
    return f"{v:,.1f}"


def time_ms(v: Any) -> str:
    """A time per token: n/m where it is zero at this resolution (the tokens came together, in one read: no
    time of generation can be zero), else as ``ms``."""
    return "—" if missing(v) else "n/m" if float(v) < 0.05 else ms(v)


def ms(v: Any) -> str:
    return "—" if missing(v) else f"{float(v):,.0f} ms" if float(v) >= 100 else f"{float(v):,.1f} ms"


def ctx(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens >= 1024 and tokens % 1024 == 0 else str(tokens)


def whole(v: Any, fmt: str = "{:,.0f}") -> str:
    return "—" if missing(v) else fmt.format(float(v))


def integer(v: Any) -> str:
    return "—" if missing(v) else f"{int(v):,}"


def pct(v: Any) -> str:
    """A fraction as a percentage: 0.766 -> 76.6%."""
    return "—" if missing(v) else f"{float(v):.1%}"


def share(fraction: Any) -> str:
    """A shared-prefix ratio: 0.875 -> 87.5%, 0.25 -> 25%."""
    return f"{float(fraction):.1%}".replace(".0%", "%")


def delta(a: Any, b: Any) -> str:
    """b against a, as a percentage (seed 003: "35.7% faster")."""
    if missing(a) or missing(b) or float(a) == 0:
        return "—"
    return f"{(float(b) / float(a) - 1):+.1%}"


def seconds(v: Any) -> str:
    return "—" if missing(v) else f"{float(v):.1f} s"


def minutes(v: Any) -> str:
    """A wall time as people read one: 312.4 -> "5 min 12 s", 31.6 -> "32 s"."""
    if missing(v):
        return "—"
    m, s = divmod(int(round(float(v))), 60)
    return f"{m} min {s} s" if m else f"{s} s"
