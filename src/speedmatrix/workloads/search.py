"""The one search every searching kind runs: doubling a load until a step fails, then bisection between the highest
load that held and the lowest that failed.

The load is an integer (requests at once: ``slo_search``; users: ``session_search``) or a real number (a request
rate: ``rate_search``; a trace's time scale: ``replay_search``). A kind gives the search one step (measure at a
load and say whether its target held: True, False, or None where the step cannot be judged, such as a client
that fell behind its schedule, which stops the search there) and the load's kind (:class:`Load`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

Step = Callable[[float], Awaitable[bool | None]]


@dataclass(frozen=True)
class Load:
    """How a search moves over its load: whole numbers (bisection ends when the bracket has no whole number
    inside), or real numbers (bisection ends when the bracket is within ``resolution`` of its lower end)."""

    integer: bool
    resolution: float = 0.0

    def midpoint(self, good: float, bad: float) -> float:
        return (int(good) + int(bad)) // 2 if self.integer else round((good + bad) / 2, 6)

    def narrow(self, good: float, bad: float) -> bool:
        return bad - good <= 1 if self.integer else bad - good <= self.resolution * good


COUNT = Load(integer=True)


@dataclass(frozen=True)
class Found:
    answer: float  # the highest load that held (0: none did)
    failed: float | None  # the lowest load that failed (None: none did)
    stopped_at: float | None  # the load at which a step could not be judged and the search stopped (None: it did not)


async def search(step: Step, start: float, upper: float, load: Load) -> Found:
    """Doubling from ``start`` until a step fails, cannot be judged, or reaches ``upper``; then bisection between
    the highest load that held and the lowest that failed, until ``load`` calls the bracket narrow."""
    good, bad, stopped = (0 if load.integer else 0.0), None, None
    x = start
    while True:
        held = await step(x)
        if held is None:
            stopped = x
            break
        if not held:
            bad = x
            break
        good = x
        if x >= upper:
            break
        x = min(2 * x, upper)
    while stopped is None and bad is not None and good > 0 and not load.narrow(good, bad):
        x = load.midpoint(good, bad)
        held = await step(x)
        if held is None:
            stopped = x
            break
        good, bad = (x, bad) if held else (good, x)
    return Found(good, bad, stopped)
