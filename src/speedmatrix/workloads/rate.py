"""Open-loop arrivals at a request rate: requests sent on a seeded schedule whether or not the server keeps up.

Each cell is one rate of a block's ``rates`` with its arrival process (constant,
Poisson, gamma with a burstiness): its schedule, window rule and client-bound
verdict are ``speedmatrix.measure.arrivals``. A cell is not held at a concurrency: its
``concurrency`` is 0 (open loop), and how many requests were in flight is a
figure (``avg_active_requests``), not a setting.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from ..core import fmt
from ..core.status import Status
from ..core.table import Table
from ..measure import arrivals
from .base import Cell, CellRun, Column, Measured, Workload, register, sampling_of
from .open_loop import send_on_schedule

FOOTNOTE = (
    "Open loop: requests are sent on their schedule whether or not earlier ones have ended. Offered: the rate "
    "asked for; scheduled: the rate the seeded schedule drew in the window; achieved: the rate the client "
    "sent at. Lag: how late the client sent a request against its schedule. Client-bound: the client fell "
    "behind its schedule (the lag's p95 over the cell's limit, or the achieved rate under its share of the "
    "scheduled one): the figure is the client's, not the server's, and is not published as the server's. "
    "Saturated: the server's queue grew through the window (TTFT and requests in flight rising with the "
    "schedule): the figures are not a steady state."
)


def arrival_of(cell: Cell) -> arrivals.Arrival:
    """The cell's arrival process and window (its options)."""
    o = cell.opts
    return arrivals.Arrival(rate=o["rate"], kind=o["arrival"], burstiness=o["burstiness"],
                            duration_s=float(cell.duration_s), warmup_s=o["warmup_s"], seed=o["seed"])


def rate_point(row: Any, series: str) -> list[dict[str, Any]]:
    """An open-loop cell's matrix row as one point of goodput against offered rate (none if it was not sent)."""
    if row.status == Status.OVER_CAPACITY:
        return []
    return [{"series": series, "offered_rate_rps": row.offered_rate_rps, "achieved_rate_rps": row.achieved_rate_rps,
             "output_tok_s": row.total_tok_s, "goodput_tok_s": row.goodput_tok_s, "slo": row.slo,
             "status": row.status}]


@register
class Rate(Workload):
    name = "rate"
    order = 5
    by_hand = False
    title = "Open-loop rate"
    blurb = "requests sent on a seeded schedule at each rate; offered against achieved rate, send lag, latency"
    footnote = FOOTNOTE
    concurrency_in_id = False
    open_loop = True
    # vllm bench serve sends N requests at --request-rate with --burstiness (Poisson, gamma): the same arrivals
    reference = True
    stability_figure = "output_throughput"
    matrix_columns = (
        Column("arrival", "—", "`arrival`",
               "rate cells: constant, poisson or gamma<shape> (speedmatrix.measure.arrivals); their `concurrency` is "
               "0: open loop, not held",
               "`--burstiness` (1: poisson)"),
        Column("offered_rate_rps", "requests/s", "`offered_rate_rps`",
               "rate cells: the rate asked for",
               "`--request-rate`"),
        Column("scheduled_rate_rps", "requests/s", "`scheduled_rate_rps`",
               "rate cells: the rate the seeded schedule drew, over the counted requests' scheduled times"),
        Column("achieved_rate_rps", "requests/s", "`achieved_rate_rps`",
               "rate cells: the rate the client sent the counted requests at"),
        Column("schedule_lag_p50_ms", "ms", "`schedule_lag_p50_ms`",
               "rate cells: the median of actual minus scheduled send time (the client's lateness)"),
        Column("schedule_lag_p95_ms", "ms", "`schedule_lag_p95_ms`",
               "rate cells: the p95 of the client's lateness; above `lag_limit_ms` the cell is client_bound"),
        Column("schedule_lag_max_ms", "ms", "`schedule_lag_max_ms`",
               "rate cells: the client's longest lateness"),
        Column("counted_requests", "requests", "`counted_requests`",
               "rate cells: requests scheduled inside the window after the warm-up (the figures' requests)"),
        Column("ttft_trend_rho", "—", "`ttft_trend_rho`",
               "rate cells: Spearman's rank correlation of TTFT with the scheduled send time (saturation test, "
               "speedmatrix.measure.arrivals)"),
        Column("ttft_growth", "ratio", "`ttft_growth`",
               "rate cells: the median TTFT of the last third of the requests over the first third's"),
        Column("in_flight_growth", "ratio", "`in_flight_growth`",
               "rate cells: the requests in flight at a send, the last third of the requests over the first third"),
        Column("littles_law_ratio", "ratio", "`littles_law_ratio`",
               "rate cells: over the span the requests were sent in, the mean requests in flight over (send rate x "
               "mean time in the system); near 1 in a steady state, below 1 where a queue outlasts the span"),
    )

    def expand(self, server_id: str, block: dict[str, Any]) -> list[Cell]:
        out = []
        for ctx in block["contexts"]:
            for rate in block["rates"]:
                options = {"rate": rate, "arrival": block["arrival"], "burstiness": block["burstiness"],
                           "warmup_s": block["warmup_s"], "seed": block["seed"], "lag_limit_ms": block["lag_limit_ms"],
                           "min_achieved": block["min_achieved"]}
                out.append(Cell(server_id, self.name, ctx, 0, block["max_tokens"], float(block["duration_s"]),
                                corpus=block["corpus"], repeats=block.get("repeats", 1),
                                options=json.dumps(options, sort_keys=True), sampling=sampling_of(block)))
        return out

    id_pattern = r"-r[0-9.]+-(constant|poisson|gamma[0-9.]+)"

    def id_suffix(self, cell: Cell) -> str:
        return f"-r{cell.opts['rate']:g}-{arrival_of(cell).label()}"

    def reference_load(self, cell: Cell) -> dict[str, Any]:
        """What the other clients of the reference rule are asked for: every request of the schedule, at the
        rate, on gamma gaps of the cell's shape (Poisson: 1). They have no warm-up rule: the reference measures
        the cell with none (``for_reference``)."""
        a = arrival_of(cell)
        return {"requests": len(a.schedule(1)), "rate": a.rate,
                "burstiness": 1.0 if a.kind == "poisson" else a.burstiness}

    def for_reference(self, cell: Cell) -> Cell:
        return replace(cell, options=json.dumps({**cell.opts, "warmup_s": 0}, sort_keys=True))

    def reference_problem(self, cell: Cell) -> str | None:
        return ("constant arrivals: vllm bench serve draws Poisson or gamma gaps; give the cell `arrival: poisson` "
                "or `gamma`" if cell.opts["arrival"] == "constant" else None)

    async def prepare(self, run: CellRun) -> tuple[list[float], list]:
        schedule = arrival_of(run.cell).schedule(run.repeat)
        prompts = await run.build([run.source.prompt(i, run.cell.context_tokens, run.salt)
                                   for i in range(len(schedule))])
        return schedule, prompts

    async def measure(self, run: CellRun, prepared: tuple[list[float], list]) -> Measured:
        cell, (schedule, prompts) = run.cell, prepared
        arrival = arrival_of(cell)
        run.progress(f"rate: {arrival.rate:g} req/s {arrival.label()} for {arrival.duration_s:g} s "
                     f"({len(schedule)} requests scheduled, warm-up {arrival.warmup_s:g} s), context "
                     f"{cell.context_tokens}")
        records, figures = await send_on_schedule(run, arrival, schedule, prompts)
        if figures["client_bound"]:
            figures["status"] = Status.CLIENT_BOUND
            figures["status_reason"] = figures["client_bound_reason"]
        elif figures["saturated"]:
            figures["status"] = Status.SATURATED
            figures["status_reason"] = figures["saturation_reason"]
        return Measured(figures, records)

    def slo_scope(self, result: dict[str, Any]) -> tuple[str | None, float | None]:
        """Targets are judged on the counted requests only (a warm-up request's phase is "warmup"), over the
        cell's measured span."""
        return "", None

    def matrix_fields(self, cell: dict[str, Any], result: dict[str, Any],
                      provenance: dict[str, Any]) -> dict[str, Any]:
        return {k: result.get(k) for k in self.column_names()}

    def report_table(self, m) -> Table:
        """Per context and rate: offered against achieved, the send lag's distribution, latency, and the goodput of
        the run's first latency target against the rate offered."""
        t = Table(["Context", "Rate", "Status", "Offered / scheduled / achieved req/s", "Send lag p50 / p95 / max",
                   "Output tok/s", "Goodput tok/s (target)", "TTFT p50", "TTFT p95", "Completed"])
        for r in m.sort_values(["context_tokens", "offered_rate_rps"]).itertuples():
            ok = r.status != Status.OVER_CAPACITY
            rates = " / ".join(fmt.num(v) for v in (r.offered_rate_rps, r.scheduled_rate_rps, r.achieved_rate_rps))
            lag = " / ".join(fmt.ms(v) for v in (r.schedule_lag_p50_ms, r.schedule_lag_p95_ms, r.schedule_lag_max_ms))
            goodput = f"{fmt.num(r.goodput_tok_s)} ({r.slo})" if ok and not fmt.missing(r.slo) else "—"
            t.add(fmt.ctx(int(r.context_tokens)), f"{fmt.num(r.offered_rate_rps)} {r.arrival}", fmt.status(r.status),
                  rates if ok else "—", lag if ok else "—", fmt.num(r.total_tok_s) if ok else "—", goodput,
                  fmt.ms(r.ttft_ms) if ok else "—", fmt.ms(r.p95_ttft_ms) if ok else "—",
                  fmt.integer(r.completed_requests) if ok else "—")
        return t

    def cell_label(self, row: Any) -> str:
        return f"{fmt.num(row.offered_rate_rps)} req/s / {fmt.ctx(int(row.context_tokens))}"

    def rate_points(self, row: Any) -> list[dict[str, Any]]:
        return rate_point(row, f"rate cells, {fmt.ctx(int(row.context_tokens))}")
