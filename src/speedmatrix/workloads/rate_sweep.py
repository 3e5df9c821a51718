"""Rate sweep: GuideLLM's sweep profile in one cell's job: how fast one user is served, how much the server takes
at most, and what happens at the open-loop rates between the two.

1. **synchronous**: ``requests`` requests one at a time; its request rate is the lowest load worth offering.
2. **throughput**: at least ``requests`` requests (twice the concurrency where that is more) at
   ``max_concurrency`` in flight (capped where the live server's KV cache holds fewer); its request rate is the
   most the server completes.
3. **rates**: ``rates`` open-loop rates spaced evenly between the two (both ends left out), each a seeded schedule
   of ``duration_s`` with the window rule of a rate cell (``speedmatrix.measure.arrivals``: requests scheduled in the
   first ``warmup_s`` not counted), its send lag, client-bound and saturation verdicts.

Every step is judged on the block's latency target (``slo``): attainment, the percentile rule and goodput, so the
report can draw goodput against the offered rate. A client-bound or saturated step is marked, never drawn as the
server's steady state. The steps are kept in the cell's result (``rate_sweep_steps``) and their requests in
requests.parquet (phase ``synchronous``, ``throughput``, ``rate<k>``, warm-up ones ``rate<k>warmup``); the
cell's own figures are the throughput step's.
"""

from __future__ import annotations

import json
from typing import Any

from ..core import fmt
from ..core.status import Status
from ..core.table import Table
from ..measure import arrivals, client, slo, stats
from .base import Cell, CellRun, Column, Measured, Workload, register, sampling_of
from .open_loop import send_on_schedule
from .slo_search import frame, searched

FOOTNOTE = ("Synchronous: one request at a time; throughput: as many in flight as the step's concurrency; the rates "
            "between are open loop (offered against achieved, as a rate cell). Goodput: output tokens of the "
            "requests that met the target, a second. A client-bound step measured the client, a saturated one a "
            "growing queue: neither is the server's steady state. n/m: the server delivered the step's streams in "
            "whole bursts, so its TTFT describes the delivery, not the first token (docs/fidelity.md, section 5).")


def rates_between(low: float, high: float, n: int) -> list[float]:
    """``n`` rates spaced evenly strictly between ``low`` and ``high`` (GuideLLM's sweep), rounded to 4 digits."""
    if n <= 0 or high <= low:
        return []
    return [round(low + (high - low) * k / (n + 1), 4) for k in range(1, n + 1)]


def step_row(step: int, profile: str, records: list[client.RequestRecord], window_s: float, target: slo.Target,
             figures: dict[str, Any], rate: float | None = None, concurrency: int | None = None) -> dict[str, Any]:
    """One step of the sweep as the result keeps it."""
    judged = slo.evaluate(frame([r for r in records if r.counted]), target, window_s)
    status = (Status.CLIENT_BOUND if figures.get("client_bound") else Status.SATURATED if figures.get("saturated")
              else Status.VALID)
    return {"step": step, "profile": profile, "offered_rate_rps": rate, "concurrency": concurrency,
            "requests": figures.get("counted_requests", len(records)), "window_s": window_s,
            "request_rate_rps": figures.get("request_throughput"),
            "achieved_rate_rps": figures.get("achieved_rate_rps"),
            "output_tok_s": figures.get("output_throughput"), "ttft_p50_ms": figures.get("median_ttft_ms"),
            "ttft_p95_ms": figures.get("p95_ttft_ms"), "tpot_p50_ms": figures.get("median_tpot_ms"),
            "schedule_lag_p95_ms": figures.get("schedule_lag_p95_ms"), "attainment": judged["attainment"],
            "holds": judged["slo_met"], "goodput_tok_s": judged["goodput_tok_s"], "status": status,
            "delivery": figures.get("delivery"),
            "reason": figures.get("client_bound_reason") or figures.get("saturation_reason")}


@register
class RateSweep(Workload):
    name = "rate_sweep"
    loads_follow_run = True  # its rates lie between the ends it measured in this run
    order = 6
    by_hand = False
    title = "Rate sweep"
    blurb = ("one request at a time, then as many as the server takes, then open-loop rates spaced between the two "
             "(GuideLLM's sweep profile), within one job: goodput on a latency target against the offered rate")
    footnote = FOOTNOTE
    concurrency_in_id = False
    open_loop = True
    slo = False  # each step is judged on the block's own target (rate_sweep_steps)
    matrix_columns = (
        Column("sweep_slo", "—", "`slo_target.name`", "rate sweeps: the latency target every step is judged on"),
        Column("sweep_sync_rate_rps", "requests/s", "`sweep_sync_rate_rps`",
               "rate sweeps: the request rate of the synchronous step (one at a time): the low end of the open-loop "
               "rates"),
        Column("sweep_max_rate_rps", "requests/s", "`sweep_max_rate_rps`",
               "rate sweeps: the request rate of the throughput step (`max_concurrency` in flight): the high end of "
               "the open-loop rates"),
        Column("rate_sweep_steps", "JSON", "`rate_sweep_steps`",
               "rate sweeps: every step (profile, offered rate or concurrency, requests, request and achieved rate, "
               "output tok/s, goodput, attainment, holds, TTFT p50/p95, TPOT p50, send lag p95, status "
               "valid/client_bound/saturated and its reason)"),
    )

    def expand(self, server_id: str, block: dict[str, Any]) -> list[Cell]:
        options = {"slo": block["slo"], "target": block["target"], "rates": block["rates"],
                   "arrival": block["arrival"], "burstiness": block["burstiness"], "warmup_s": block["warmup_s"],
                   "seed": block["seed"], "lag_limit_ms": block["lag_limit_ms"], "min_achieved": block["min_achieved"]}
        return [Cell(server_id, self.name, ctx, int(block["max_concurrency"]), block["max_tokens"],
                     float(block["duration_s"]), requests=block["requests"], corpus=block["corpus"],
                     sampling=sampling_of(block), options=json.dumps(options, sort_keys=True))
                for ctx in block["contexts"]]

    id_pattern = r"-for-[a-z][a-z0-9_]*"

    def id_suffix(self, cell: Cell) -> str:
        return f"-for-{cell.opts['slo']}"

    async def prepare(self, run: CellRun) -> None:
        return None  # each step builds its prompts before its clock starts

    async def measure(self, run: CellRun, _prepared: None) -> Measured:
        cell, o = run.cell, run.cell.opts
        target = slo.target(o["slo"], o["target"])
        upper = cell.concurrency
        if run.kv_tokens:
            upper = max(1, min(upper, run.kv_tokens // (cell.context_tokens + cell.max_tokens)))
        sent, steps, batches = {"n": 0}, [], {}

        async def prompts(n: int) -> tuple[int, list]:
            first = sent["n"]
            sent["n"] += n
            return first, await run.build([run.source.prompt(i, cell.context_tokens, run.salt)
                                           for i in range(first, first + n)])

        async def closed(profile: str, c: int, n: int) -> dict[str, Any]:
            first, ps = await prompts(n)
            wall, recs = await client.fixed_count(run.url, run.model, lambda i: ps[i - first], n, c, run.opts,
                                                  phase=profile, first_index=first)
            batches[len(steps) + 1] = recs
            steps.append(step_row(len(steps) + 1, profile, recs, wall, target, stats.fixed(recs, wall),
                                  concurrency=c))
            return steps[-1]

        run.progress(f"rate sweep: synchronous, throughput at {upper} in flight, then {o['rates']} rates between, "
                     f"context {cell.context_tokens}, judged on {target.name} ({target.describe()})")
        low = (await closed("synchronous", 1, cell.requests))["request_rate_rps"] or 0.0
        high = (await closed("throughput", upper, max(cell.requests, 2 * upper)))["request_rate_rps"] or 0.0
        run.progress(f"rate sweep: synchronous {low:.2f} req/s, throughput {high:.2f} req/s")
        between = rates_between(low, high, int(o["rates"]))
        stopped = None if between else (f"the throughput end ({high:.2f} req/s) is not above the synchronous end "
                                        f"({low:.2f} req/s): no rates between them")
        if stopped:
            run.progress(f"rate sweep: {stopped}")
        for k, rate in enumerate(between, start=1):
            arrival = arrivals.Arrival(rate=rate, kind=o["arrival"], burstiness=o["burstiness"],
                                       duration_s=float(cell.duration_s), warmup_s=o["warmup_s"], seed=o["seed"])
            schedule = arrival.schedule(k)
            first, ps = await prompts(len(schedule))
            recs, figures = await send_on_schedule(run, arrival, schedule, ps, f"rate{k}", first)
            batches[len(steps) + 1] = recs
            steps.append(step_row(len(steps) + 1, f"rate{k}", recs, figures["span_s"] or 0.0, target, figures,
                                  rate=rate))
            run.progress(f"rate sweep step {len(steps)}: {rate:g} req/s, {steps[-1]['status']}, goodput "
                         f"{fmt.num(steps[-1]['goodput_tok_s'])} tok/s")
        records = [r for k in sorted(batches) for r in batches[k]]
        figures = stats.fixed(batches[2], steps[1]["window_s"])
        figures.update({**searched(records, [s["window_s"] for s in steps]), "sweep_sync_rate_rps": low,
                        "sweep_max_rate_rps": high, "rate_sweep_steps": steps, "slo_target": target.as_dict(),
                        "slo_search_stopped": stopped})
        return Measured(figures, records)

    def matrix_fields(self, cell: dict[str, Any], result: dict[str, Any],
                      provenance: dict[str, Any]) -> dict[str, Any]:
        steps = result.get("rate_sweep_steps")
        return {"sweep_slo": (result.get("slo_target") or {}).get("name"),
                "sweep_sync_rate_rps": result.get("sweep_sync_rate_rps"),
                "sweep_max_rate_rps": result.get("sweep_max_rate_rps"),
                "rate_sweep_steps": json.dumps(steps) if steps else None,
                "slo_search_stopped": result.get("slo_search_stopped")}

    def cell_label(self, row: Any) -> str:
        return f"rate sweep / {fmt.ctx(int(row.context_tokens))}"

    def rate_points(self, row: Any) -> list[dict[str, Any]]:
        steps = json.loads(row.rate_sweep_steps) if isinstance(row.rate_sweep_steps, str) else []
        return [{"series": f"rate sweep, {fmt.ctx(int(row.context_tokens))}", "offered_rate_rps": s["offered_rate_rps"],
                 "achieved_rate_rps": s["achieved_rate_rps"], "output_tok_s": s["output_tok_s"],
                 "goodput_tok_s": s["goodput_tok_s"], "slo": row.sweep_slo, "status": s["status"]}
                for s in steps if s["offered_rate_rps"] is not None]

    def report_table(self, m) -> Table:
        t = Table(["Context", "Step", "Load", "Achieved req/s", "Output tok/s", "Goodput tok/s (target)",
                   "Attainment", "TTFT p50 / p95", "Send lag p95", "Status"])
        for r in m.sort_values("context_tokens").itertuples():
            target = "" if fmt.missing(r.sweep_slo) else r.sweep_slo
            for s in json.loads(r.rate_sweep_steps) if isinstance(r.rate_sweep_steps, str) else []:
                load = (f"{fmt.num(s['offered_rate_rps'])} req/s" if s["offered_rate_rps"] is not None
                        else f"c{s['concurrency']}")
                achieved = s["achieved_rate_rps"] if s["offered_rate_rps"] is not None else s["request_rate_rps"]
                t.add(fmt.ctx(int(r.context_tokens)), s["profile"], load, fmt.num(achieved), fmt.num(s["output_tok_s"]),
                      f"{fmt.num(s['goodput_tok_s'])} ({target})" if target else fmt.num(s["goodput_tok_s"]),
                      fmt.pct(s["attainment"]) if s["attainment"] is not None else "—",
                      ("n/m: streams batched" if s.get("delivery") == "batched"
                       else f"{fmt.ms(s['ttft_p50_ms'])} / {fmt.ms(s['ttft_p95_ms'])}"),
                      fmt.ms(s["schedule_lag_p95_ms"]),
                      fmt.status(s["status"]) + (f": {s['reason']}" if s["reason"] else ""))
            if isinstance(r.slo_search_stopped, str):
                t.add(fmt.ctx(int(r.context_tokens)), "—", "", "", "", "", "", "", "",
                      f"stopped: {r.slo_search_stopped}")
        return t
