"""Trace replay: a production trace's requests sent on the trace's own schedule, lengths and prefix sharing.

The cell's ``corpus`` is the trace (a dataset of the experiment in a trace format, ``speedmatrix.measure.traces``). Its
requests in the window (``start_s``, ``duration_s`` of trace time; ``sample`` keeps a seeded share) are sent open
loop at their trace time divided by ``time_scale`` (2: twice as fast), each with its prompt length and its output
capped at its trace length (lengths times ``token_scale``; the cell's ``max_tokens`` caps every output);
prompts longer than the cell's context are skipped and counted. Prompts are sent as token ids, so requests that
share a hash id share exactly those tokens. The schedule's keeping (send lag, achieved against offered rate,
client-bound) and the saturation test are a rate cell's. For a trace with hash ids, the theoretical prefix-hit
rate (an LRU cache of the server's KV size; and unbounded) stands beside the hit rate the server measured (its
counters over the cell, and its per-request cached tokens where it reports them).
"""

from __future__ import annotations

import json
from typing import Any

from ..core import fmt
from ..core.errors import CellError
from ..core.status import Status
from ..core.table import Table
from ..measure import arrivals, traces
from ..measure.prompts import Tagged
from .base import Cell, CellRun, Column, Measured, Workload, register, sampling_of
from .open_loop import send_on_schedule
from .rate import Rate, rate_point


@register
class Replay(Workload):
    name = "replay"
    order = 9
    by_hand = False
    title = "Trace replay"
    blurb = ("a trace's requests on its own schedule (scaled in time), with its lengths and its prefix sharing: "
             "offered against achieved rate, and the prefix-hit rate the trace allows against the server's")
    footnote = ("Theoretical hits: the trace's requests in arrival order against an LRU cache of the server's KV size "
                "(whole blocks, the leading run of a prompt's blocks); unbounded: with no eviction. Measured: the "
                "server's prefix-cache counters over the cell, and the share of prompt tokens its usage reports as "
                "cached. The server caches in its own block size and cannot reuse a block still being computed.")
    concurrency_in_id = False
    open_loop = True
    reads_trace = True
    matrix_columns = (
        Column("time_scale", "ratio", "`time_scale`",
               "replays: the trace's times divided by this (2: twice as fast); a replay's rate, lag and saturation "
               "columns are a rate cell's, `arrival` is `trace x<scale>`"),
        Column("trace_requests", "requests", "`trace_requests`",
               "replays: the window's requests sent"),
        Column("trace_prompts_skipped", "requests", "`trace_prompts_skipped`",
               "replays: the window's requests longer than the context, skipped"),
        Column("theoretical_prefix_hit_rate", "fraction", "`theoretical_prefix_hit_rate`",
               "replays of a trace with hash ids: the prompt tokens an LRU cache of the server's KV size would "
               "serve, the window sent in arrival order (speedmatrix.measure.traces)"),
        Column("theoretical_prefix_hit_rate_unbounded", "fraction", "`theoretical_prefix_hit_rate_unbounded`",
               "replays of a trace with hash ids: the same with a cache that never evicts"),
    )

    def expand(self, server_id: str, block: dict[str, Any]) -> list[Cell]:
        out = []
        for ctx in block["contexts"]:
            for scale in block["time_scale"]:
                options = {"time_scale": scale, "token_scale": block["token_scale"], "start_s": block["start_s"],
                           "window_s": block.get("duration_s"), "sample": block["sample"], "seed": block["seed"],
                           "lag_limit_ms": block["lag_limit_ms"], "min_achieved": block["min_achieved"]}
                out.append(Cell(server_id, self.name, ctx, 0, block["max_tokens"], corpus=block["trace"],
                                sampling=sampling_of(block), options=json.dumps(options, sort_keys=True)))
        return out

    id_pattern = r"-x[0-9.]+"

    def id_suffix(self, cell: Cell) -> str:
        return f"-x{cell.opts['time_scale']:g}"

    def requests(self, run: CellRun) -> tuple[list[traces.TraceRequest], int]:
        """The window's requests that fit the context, and how many did not."""
        o = run.cell.opts
        if run.records is None or not all(isinstance(q, traces.TraceRequest) for q in run.records):
            raise CellError(f"replay cell {run.cell.id}: its corpus {run.cell.corpus!r} is not a trace "
                            f"(a dataset with format {' or '.join(traces.FORMATS)})")
        reqs = traces.window(run.records, o["start_s"], o["window_s"], o["sample"], o["seed"])
        fit = [q for q in reqs if traces.scaled(q, o["token_scale"])[0] <= run.cell.context_tokens]
        if not fit:
            raise CellError(f"replay cell {run.cell.id}: no request of the window fits the "
                            f"{run.cell.context_tokens}-token context at token_scale {o['token_scale']:g}")
        return fit, len(reqs) - len(fit)

    async def prepare(self, run: CellRun) -> tuple[list, list, int]:
        o = run.cell.opts
        fit, skipped = self.requests(run)
        prompts = []
        for i, q in enumerate(fit):
            ids = Tagged(traces.prompt_ids(q, i, o["token_scale"], run.source.corpus_ids, run.salt))
            ids.max_tokens = traces.scaled(q, o["token_scale"])[1]
            prompts.append(ids)
        return fit, prompts, skipped

    async def replay(self, run: CellRun, fit: list, prompts: list, scale: float, phase: str = "",
                     first: int = 0) -> tuple[list, dict[str, Any]]:
        """Send the window's requests on the trace's times divided by ``scale``: every record and the figures (a
        rate cell's: the client's figures over the span, the schedule's keeping, saturation)."""
        schedule = [q.t_s / scale for q in fit]
        span = (schedule[-1] if schedule else 0.0) + 1e-6
        arrival = arrivals.Arrival(rate=len(schedule) / span if span > 1e-3 else float(len(schedule)), kind="trace",
                                   duration_s=span, seed=run.cell.opts["seed"])
        run.progress(f"replay: {len(fit)} requests of the trace over {span:.1f} s (time x{scale:g})")
        records, figures = await send_on_schedule(run, arrival, schedule, prompts, phase, first)
        figures["arrival"] = f"trace x{scale:g}"
        return records, figures

    async def measure(self, run: CellRun, prepared: tuple[list, list, int]) -> Measured:
        o = run.cell.opts
        fit, prompts, skipped = prepared
        if skipped:
            run.progress(f"{skipped} requests of the window longer than the context skipped")
        records, figures = await self.replay(run, fit, prompts, o["time_scale"])
        figures["time_scale"] = o["time_scale"]
        figures["trace_requests"] = len(fit)
        figures["trace_prompts_skipped"] = skipped
        hits = traces.prefix_hits(fit, o["token_scale"], run.kv_tokens)
        figures["theoretical_prefix_hit_rate"] = hits["hit_rate"]
        figures["theoretical_prefix_hit_rate_unbounded"] = traces.prefix_hits(fit, o["token_scale"], None)["hit_rate"]
        if figures["client_bound"]:
            figures["status"], figures["status_reason"] = Status.CLIENT_BOUND, figures["client_bound_reason"]
        elif figures["saturated"]:
            figures["status"], figures["status_reason"] = Status.SATURATED, figures["saturation_reason"]
        return Measured(figures, records)

    def slo_scope(self, result: dict[str, Any]) -> tuple[str | None, float | None]:
        return "", None

    def matrix_fields(self, cell: dict[str, Any], result: dict[str, Any],
                      provenance: dict[str, Any]) -> dict[str, Any]:
        # a replay's rate, lag and saturation columns are a rate cell's
        return {k: result.get(k) for k in (*self.column_names(), *Rate.column_names())}

    def rate_points(self, row: Any) -> list[dict[str, Any]]:
        return rate_point(row, f"replay of {row.corpus}")

    def cell_label(self, row: Any) -> str:
        return f"{row.corpus} x{fmt.num(row.time_scale)}"

    def report_table(self, m) -> Table:
        t = Table(["Trace", "Time scale", "Status", "Requests (skipped)", "Offered / achieved req/s",
                   "Send lag p95", "TTFT p50 / p95", "Output tok/s", "Prefix hits: theoretical (unbounded)",
                   "Measured: counters / cached tokens"])
        for r in m.sort_values(["corpus", "time_scale"]).itertuples():
            if r.status == Status.OVER_CAPACITY:
                continue
            cached = r.cached_prompt_share
            t.add(r.corpus, f"x{fmt.num(r.time_scale)}", fmt.status(r.status),
                  f"{fmt.integer(r.trace_requests)} ({fmt.integer(r.trace_prompts_skipped)})",
                  f"{fmt.num(r.offered_rate_rps)} / {fmt.num(r.achieved_rate_rps)}", fmt.ms(r.schedule_lag_p95_ms),
                  f"{fmt.ms(r.ttft_ms)} / {fmt.ms(r.p95_ttft_ms)}", fmt.num(r.total_tok_s),
                  f"{fmt.pct(r.theoretical_prefix_hit_rate)} ({fmt.pct(r.theoretical_prefix_hit_rate_unbounded)})",
                  f"{fmt.pct(r.prefix_cache_hit_rate)} / {fmt.pct(cached) if not fmt.missing(cached) else '—'}")
        return t
