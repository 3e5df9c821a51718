"""Open-loop arrivals: when each request of a rate cell is sent, and whether the client kept that schedule.

A schedule is a list of send times (seconds from the cell's start) drawn from
seeded inter-arrival times at a request rate:

- ``constant``: every ``1 / rate`` seconds;
- ``poisson``: exponential gaps of mean ``1 / rate`` (a Poisson process);
- ``gamma``: gamma gaps of shape ``burstiness`` and mean ``1 / rate`` (``vllm bench serve --burstiness``:
  below 1 burstier than Poisson, above 1 smoother; 1 is Poisson).

The same cell (kind, rate, arrival, seed, repeat) gives the same schedule on any
machine: a rerun sends the same requests at the same offsets.

**The window rule.** Requests scheduled in ``[0, warmup_s)`` are sent to load
the server and not counted; requests scheduled in ``[warmup_s, duration_s)``
are counted; none is scheduled after the window. Every request runs to its end
(none is cut): a counted request that straddles the window's end is counted
whole, and the cell's rates are over the span from the first counted send to
the last counted end.

**Saturation.** An open-loop cell whose server cannot keep up has a queue that
grows through the window: later requests wait longer for their first token and
more requests are in flight when each is sent. The cell is ``saturated`` when
both hold over its counted requests in order of their scheduled time: time to
first token rises (Spearman's rank correlation with the scheduled time at least
0.5, and the median of the last third at least twice the first third's, or
above it by a tenth of the span the requests were sent in or more: a queue
that built up before the window, in the warm-up, already starts it at seconds,
as at 512 requests a second on an H200 where it went from 7 s to 14 s within
each 7 s window), and the requests in flight at each send grow (the last
third's median at least 1.5 times the first third's, and at least 2 more). Its figures are kept but are not
a steady state, and no decision uses them. Little's law (requests in flight =
arrival rate x time in the system) is checked on every cell over the span its
requests were sent in: ``littles_law_ratio`` is the mean in flight measured
there over the send rate times the mean time in the system; near 1 in a
steady state, below where a queue outlasts the span.

**The client's own limit.** A request's lag is its actual send time minus its
scheduled one. A cell whose client fell behind (the lag's 95th percentile above
``lag_limit_ms``, or the achieved send rate below ``min_achieved`` of the rate
its schedule offered in the window) is ``client_bound``: the figure measured
the client, not the server, and it is not published as the server's.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from .stats import percentile

KINDS = ("constant", "poisson", "gamma")


@dataclass(frozen=True)
class Arrival:
    """How a rate cell's requests arrive (the kind's options, recorded in the cell)."""

    rate: float  # requests per second offered
    kind: str = "poisson"
    burstiness: float = 1.0  # gamma's shape (1: Poisson)
    duration_s: float = 10.0
    warmup_s: float = 0.0
    seed: int = 0

    def label(self) -> str:
        """The cell id's part: constant, poisson, or gamma<shape>."""
        return f"gamma{self.burstiness:g}" if self.kind == "gamma" else self.kind

    def schedule(self, repeat: int = 1) -> list[float]:
        """Send times in seconds from the start, every one before ``duration_s``; seeded by the seed and repeat."""
        if self.kind not in KINDS:
            raise ValueError(f"unknown arrival {self.kind!r}; known: {', '.join(KINDS)}")
        if self.kind == "constant":  # i / rate, not a running sum (which drifts by rounding)
            return [t for t in (i / self.rate for i in range(math.ceil(self.duration_s * self.rate) + 1))
                    if t < self.duration_s]
        rng = random.Random(f"{self.seed}/{self.kind}/{self.burstiness}/{self.rate}/{repeat}")
        mean = 1.0 / self.rate
        out, t = [], 0.0
        while True:
            t += (rng.expovariate(self.rate) if self.kind == "poisson"
                  else rng.gammavariate(self.burstiness, mean / self.burstiness))
            if t >= self.duration_s:
                return out
            out.append(t)


def counted(scheduled: float, arrival: Arrival) -> bool:
    """Whether a request scheduled at this time is one the cell's figures count (the window rule)."""
    return arrival.warmup_s <= scheduled < arrival.duration_s


def keeping(sends: list[tuple[float, float]], ends: list[float], arrival: Arrival, lag_limit_ms: float,
            min_achieved: float) -> dict[str, Any]:
    """How well the client kept its schedule: ``sends`` the counted requests' (scheduled, actual) send times,
    ``ends`` their end times. The offered rates, the achieved one, the lag's distribution and the verdict."""
    window = arrival.duration_s - arrival.warmup_s
    lags = [max(0.0, actual - sched) * 1000 for sched, actual in sends]
    actual = sorted(a for _, a in sends)
    # the achieved send rate over the span the schedule offered its requests in (first to last scheduled)
    sched = sorted(s for s, _ in sends)
    achieved = None
    if len(actual) >= 2 and actual[-1] > actual[0]:
        achieved = (len(actual) - 1) / (actual[-1] - actual[0])
    scheduled_rate = (len(sched) - 1) / (sched[-1] - sched[0]) if len(sched) >= 2 and sched[-1] > sched[0] else None
    out = {
        "arrival": arrival.label(),
        "offered_rate_rps": arrival.rate,
        "scheduled_rate_rps": scheduled_rate,
        "achieved_rate_rps": achieved,
        "window_s": window,
        "counted_requests": len(sends),
        "schedule_lag_p50_ms": percentile(lags, 50),
        "schedule_lag_p95_ms": percentile(lags, 95),
        "schedule_lag_max_ms": max(lags) if lags else None,
        "lag_limit_ms": lag_limit_ms,
        "span_s": (max(ends) - min(actual)) if ends and actual else None,
    }
    reasons = []
    if out["schedule_lag_p95_ms"] is not None and out["schedule_lag_p95_ms"] > lag_limit_ms:
        reasons.append(f"p95 send lag {out['schedule_lag_p95_ms']:.0f} ms over the limit {lag_limit_ms:g} ms")
    if achieved is not None and scheduled_rate and achieved < min_achieved * scheduled_rate:
        reasons.append(f"sent {achieved:.2f} req/s of the {scheduled_rate:.2f} scheduled "
                       f"(under {min_achieved:.0%})")
    out["client_bound"] = bool(reasons)
    out["client_bound_reason"] = "; ".join(reasons) or None
    return out


def _thirds(values: list[float]) -> tuple[float, float]:
    k = max(1, len(values) // 3)
    return float(np.median(values[:k])), float(np.median(values[-k:]))


def _spearman(x: list[float], y: list[float]) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1]) if len(x) > 2 and np.std(rx) and np.std(ry) else 0.0


def saturation(requests: list[tuple[float, float, float | None, float | None]]) -> dict[str, Any]:
    """Whether the server's queue grew through the window (see the module's text), from the counted requests'
    (scheduled, sent, first token, end) times, with the figures the verdict rests on and Little's law."""
    done = sorted(r for r in requests if r[2] is not None and r[3] is not None)
    out: dict[str, Any] = {"saturated": False, "saturation_reason": None, "ttft_trend_rho": None,
                           "ttft_growth": None, "in_flight_growth": None, "littles_law_ratio": None}
    if len(done) < 2:
        return out
    ttft = [f - s for _, s, f, _ in done]
    starts, ends = np.sort([r[1] for r in done]), np.sort([r[3] for r in done])
    sends = np.array([r[1] for r in done])  # requests sent and not ended at each send (itself included)
    in_flight = list(np.searchsorted(starts, sends, "right") - np.searchsorted(ends, sends, "right"))
    rho = _spearman([r[0] for r in done], ttft)
    (t0, t1), (q0, q1) = _thirds(ttft), _thirds(in_flight)
    # Little's law over the span the requests were sent in: the mean in flight there against the send rate times
    # the mean time in the system (a queue that outlasts the span, or a window too short for the requests'
    # lives, puts it below 1)
    a, b = float(sends.min()), float(sends.max())
    inside = sum(max(0.0, min(e, b) - max(s, a)) for _, s, _, e in done)
    latency = float(np.mean([e - s for _, s, _, e in done]))
    little = (inside / (b - a)) / ((len(done) - 1) / (b - a) * latency) if b > a and latency > 0 else None
    out.update(ttft_trend_rho=rho, ttft_growth=t1 / t0 if t0 > 0 else None,
               in_flight_growth=q1 / q0 if q0 > 0 else None, littles_law_ratio=little)
    rises = t1 >= 2 * t0 or t1 - t0 >= 0.1 * (b - a)
    if len(done) >= 6 and rho >= 0.5 and rises and q1 >= 1.5 * q0 and q1 >= q0 + 2:  # fewer: too few to say
        out["saturated"] = True
        out["saturation_reason"] = (f"queue grew through the window: TTFT {1000 * t0:.0f} -> {1000 * t1:.0f} ms "
                                    f"(rank correlation {rho:.2f}), in flight {q0:g} -> {q1:g} at a send")
    return out


def expected_count(arrival: Arrival) -> float:
    """How many requests the schedule sends on average (rate x duration): for sizing, not for figures."""
    return arrival.rate * arrival.duration_s


def gap_cv(times: list[float]) -> float:
    """The coefficient of variation of the gaps between send times (1 for Poisson, 0 for constant)."""
    gaps = np.diff(times)
    return float(np.std(gaps) / np.mean(gaps)) if len(gaps) > 1 and np.mean(gaps) > 0 else math.nan
