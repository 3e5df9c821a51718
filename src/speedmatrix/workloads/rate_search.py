"""Rate search: the highest open-loop request rate at which a latency target still holds, found in one cell's job.

Each step sends requests on a seeded schedule (``speedmatrix.measure.arrivals``: Poisson or gamma) at one rate for
``duration_s``, every request run to its end, and judges the target on them (``speedmatrix.measure.slo``). The rates
double from ``start_rate`` until the target fails or ``max_rate`` is reached, then bisect between the highest
rate that held and the lowest that failed until they are within ``resolution`` of each other (a fraction of
the lower). The answer is the highest rate that held, with the interval the search leaves it in: the true
sustainable rate lies between it and the lowest rate that failed (``slo_max_rate_interval``; its upper end is
open where nothing failed up to the bound). A step whose client fell behind its schedule (client-bound, as in a
rate cell) cannot speak for the server: the search stops there and says so (``slo_search_stopped``). Every
step is kept (``slo_search_steps``) and its requests in requests.parquet (phase ``step<k>``); the cell's
figures are those of the step at the answer.
"""

from __future__ import annotations

import json
from typing import Any

from ..core import fmt
from ..core.table import Table
from ..measure import arrivals, slo, stats
from . import search as engine
from .base import Cell, CellRun, Column, Measured, register, sampling_of
from .open_loop import send_on_schedule
from .slo_search import TargetSearch, frame, searched


async def search_rates(probe, target: slo.Target, start: float, upper: float, resolution: float,
                       progress=print, show=lambda rate: f"{rate:g} req/s", load: str = "rate") -> dict[str, Any]:
    """The one search (``workloads.search``) over rates, or any load the schedule scales with (``load`` names it
    in each step, ``show`` in the log); ``probe(rate, step)`` returns (records, window seconds, keeping); a step
    whose client fell behind its schedule cannot be judged and stops the search."""
    steps: list[dict[str, Any]] = []
    batches: dict[int, list] = {}

    async def step(rate: float) -> bool | None:
        k = len(steps) + 1
        recs, window, keeping = await probe(rate, k)
        figures = slo.evaluate(frame(recs), target, window)
        holds = None if keeping["client_bound"] else bool(figures["slo_met"])
        steps.append({"step": k, load: rate, "requests": len(recs), "window_s": window, "holds": holds,
                      "attainment": figures["attainment"], "p_ttft_ms": figures["p_ttft_ms"],
                      "p_tpot_ms": figures["p_tpot_ms"], "goodput_tok_s": figures["goodput_tok_s"],
                      "achieved_rate_rps": keeping["achieved_rate_rps"],
                      "schedule_lag_p95_ms": keeping["schedule_lag_p95_ms"]})
        batches[k] = recs
        progress(f"search step {k}: {show(rate)}, {len(recs)} requests, "
                 + ("client-bound: " + str(keeping["client_bound_reason"]) if holds is None
                    else ("holds " if holds else "misses ") + target.name))
        return holds

    found = await engine.search(step, start, upper, engine.Load(integer=False, resolution=resolution))
    stopped = (f"the client fell behind its schedule at {show(found.stopped_at)}" if found.stopped_at is not None
               else None)
    return {"answer": found.answer, "interval": [found.answer, found.failed], "steps": steps, "batches": batches,
            "stopped": stopped}


def answered(found: dict[str, Any], target: slo.Target, load: str, steps_key: str) -> Measured:
    """A search over a load (``search_rates``) as a cell's result: the client's figures of the step at the answer,
    what every step sent, the answer with its bracket (``slo_max_<load>``, ``slo_max_<load>_interval``), why it
    stopped, and every step (``steps_key``)."""
    steps, batches = found["steps"], found["batches"]
    at = next((s for s in reversed(steps) if s["holds"] and s[load] == found["answer"]), steps[0])
    records = [r for k in sorted(batches) for r in batches[k]]
    figures = stats.fixed(batches[at["step"]], at["window_s"])
    figures.update({
        **searched(records, [s["window_s"] for s in steps]),
        f"slo_max_{load}": found["answer"], f"slo_max_{load}_interval": found["interval"],
        "slo_search_stopped": found["stopped"], "slo_search_phase": f"step{at['step']}",
        "slo_search_window_s": at["window_s"], steps_key: steps, "slo_target": target.as_dict(),
    })
    return Measured(figures, records)


def answer_cells(answer: Any, interval: Any, stopped: Any, show) -> tuple[str, str]:
    """A search's answer row in the report: the answer with the bracket the search left it in, and why it stopped
    where it did (``interval``: the matrix's JSON; ``show`` formats a load)."""
    low, high = json.loads(interval) if isinstance(interval, str) else (None, None)
    stopped = stopped if isinstance(stopped, str) else None
    bracket = (f"held; {show(high)} failed" if high is not None else "a lower bound: nothing failed "
               + ("before the search stopped" if stopped else "up to the search's bound"))
    return f"**{show(answer)}** ({bracket})", f"stopped: {stopped}" if stopped else ""


@register
class RateSearch(TargetSearch):
    name = "rate_search"
    order = 7
    by_hand = False
    title = "Rate search"
    blurb = ("the highest open-loop request rate at which a latency target holds, searched within one job "
             "(doubling, then bisection to the resolution), with the interval the search leaves it in")
    concurrency_in_id = False
    open_loop = True
    matrix_columns = (
        Column("slo_max_rate", "requests/s", "`slo_max_rate`",
               "rate searches: the highest rate at which the target held"),
        Column("slo_max_rate_interval", "requests/s", "`slo_max_rate_interval`",
               "rate searches: the bracket the search left the highest rate in (its upper end null where nothing "
               "failed up to the bound)"),
        Column("slo_rate_search_steps", "JSON", "`slo_rate_search_steps`",
               "rate searches: every step (rate, achieved rate, requests, attainment, TTFT at the percentile, goodput,"
               " held or client-bound)"),
        Column("slo_search_stopped", "—", "`slo_search_stopped`",
               "rate and replay searches: why the search stopped before its bracket closed (a step the client could "
               "not send on time); rate sweeps: why no rates were sent between the ends (the throughput end not above "
               "the synchronous one); else null"),
    )

    def expand(self, server_id: str, block: dict[str, Any]) -> list[Cell]:
        options = {"slo": block["slo"], "target": block["target"], "start_rate": block["start_rate"],
                   "max_rate": block["max_rate"], "resolution": block["resolution"], "arrival": block["arrival"],
                   "burstiness": block["burstiness"], "seed": block["seed"], "lag_limit_ms": block["lag_limit_ms"],
                   "min_achieved": block["min_achieved"]}
        return [Cell(server_id, self.name, ctx, 0, block["max_tokens"], float(block["duration_s"]),
                     corpus=block["corpus"], sampling=sampling_of(block), options=json.dumps(options, sort_keys=True))
                for ctx in block["contexts"]]

    id_pattern = r"-for-[a-z][a-z0-9_]*"

    def id_suffix(self, cell: Cell) -> str:
        return f"-for-{cell.opts['slo']}"

    async def prepare(self, run: CellRun) -> None:
        return None  # each step builds its prompts before its clock starts

    async def measure(self, run: CellRun, _prepared: None) -> Measured:
        cell, o = run.cell, run.cell.opts
        target = slo.target(o["slo"], o["target"])
        run.progress(f"rate search: highest rate up to {o['max_rate']:g} req/s where {target.name} "
                     f"({target.describe()}) holds, {o['arrival']} arrivals, {cell.duration_s:g} s a step")
        sent = {"n": 0}

        async def probe(rate: float, k: int):
            arrival = arrivals.Arrival(rate=rate, kind=o["arrival"], burstiness=o["burstiness"],
                                       duration_s=float(cell.duration_s), seed=o["seed"])
            schedule, first = arrival.schedule(k), sent["n"]
            prompts = await run.build([run.source.prompt(i, cell.context_tokens, run.salt)
                                       for i in range(first, first + len(schedule))])
            sent["n"] += len(schedule)
            recs, figures = await send_on_schedule(run, arrival, schedule, prompts, f"step{k}", first)
            return recs, figures["span_s"] or 0.0, figures

        found = await search_rates(probe, target, float(o["start_rate"]), float(o["max_rate"]),
                                   float(o["resolution"]), run.progress)
        return answered(found, target, "rate", "slo_rate_search_steps")

    def matrix_fields(self, cell: dict[str, Any], result: dict[str, Any],
                      provenance: dict[str, Any]) -> dict[str, Any]:
        steps = result.get("slo_rate_search_steps")
        interval = result.get("slo_max_rate_interval")
        return {"slo_max_rate": result.get("slo_max_rate"),
                "slo_max_rate_interval": json.dumps(interval) if interval else None,
                "slo_rate_search_steps": json.dumps(steps) if steps else None,
                "slo_search_stopped": result.get("slo_search_stopped")}

    def cell_label(self, row: Any) -> str:
        return f"rate search / {fmt.ctx(int(row.context_tokens))}"

    def report_table(self, m) -> Table:
        t = Table(["Context", "Target", "Step", "Rate req/s", "Achieved", "Requests", "Attainment", "TTFT at pct",
                   "Goodput tok/s", "Holds"])
        for r in m.sort_values("context_tokens").itertuples():
            steps = json.loads(r.slo_rate_search_steps) if isinstance(r.slo_rate_search_steps, str) else []
            for s in steps:
                t.add(fmt.ctx(int(r.context_tokens)), r.slo, s["step"], fmt.num(s["rate"]),
                      fmt.num(s["achieved_rate_rps"]), s["requests"],
                      fmt.pct(s["attainment"]) if s["attainment"] is not None else "—", fmt.ms(s["p_ttft_ms"]),
                      fmt.num(s["goodput_tok_s"]),
                      "client-bound" if s["holds"] is None else ("yes" if s["holds"] else "no"))
            if steps:
                answer, why = answer_cells(r.slo_max_rate, r.slo_max_rate_interval, r.slo_search_stopped, fmt.num)
                t.add(fmt.ctx(int(r.context_tokens)), r.slo, "answer", answer, "", "", "", "", "", why)
        return t
