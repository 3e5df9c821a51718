"""The one open-loop sender the open-loop kinds share (``rate``, ``rate_sweep``, ``rate_search``, ``replay``):
requests sent on a schedule whether or not earlier ones have ended, the counted ones judged by the window rule,
and how well the client kept its schedule (``measure.arrivals``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..measure import arrivals, client, stats
from .base import CellRun


async def send_on_schedule(run: CellRun, arrival: arrivals.Arrival, schedule: list[float], prompts: list,
                           phase: str = "", first: int = 0) -> tuple[list[client.RequestRecord], dict[str, Any]]:
    """Send ``prompts`` on ``schedule`` (open loop) and judge the counted ones (the window rule): every record
    (indexes from ``first``; phase ``phase``, warm-up ones ``<phase>warmup``) and the figures: the client's
    figures over the counted requests' span, how well the schedule was kept, saturation and Little's law."""
    _, records = await client.open_loop(run.url, run.model, prompts, schedule, run.opts,
                                        lambda t: arrivals.counted(t, arrival), run.progress)
    for r in records:
        r.index += first
        r.phase = phase + ("" if r.counted else "warmup")
    kept = [r for r in records if r.counted]
    ends = [r.end for r in kept if r.end is not None]
    keeping = arrivals.keeping([(r.scheduled, r.start) for r in kept], ends, arrival, run.cell.opts["lag_limit_ms"],
                               run.cell.opts["min_achieved"])
    zero = min((r.start for r in kept), default=0.0)
    shifted = [replace(r, start=r.start - zero, chunk_times=[t - zero for t in r.chunk_times],
                       first_token=None if r.first_token is None else r.first_token - zero,
                       end=None if r.end is None else r.end - zero) for r in kept]
    figures = stats.fixed(shifted, keeping["span_s"] or 0.0)
    figures.update(keeping)
    figures.update(arrivals.saturation([(r.scheduled, r.start, r.first_token, r.end) for r in kept]))
    figures["warmup_requests"] = len(records) - len(kept)
    figures["num_requests"] = len(records)  # every request sent (requests.parquet); the figures: counted_requests
    return records, figures
