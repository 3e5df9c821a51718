"""Replay search: the fastest time scale at which a trace's replay still meets a latency target, found in one cell's
job.

Each step replays the block's window of the trace (``workloads.replay``: its lengths, sharing and order) at one
time scale and judges the target on its requests. The scale doubles from ``start_scale`` until the target fails,
the client falls behind the schedule, or ``max_scale``, then bisects to ``resolution`` (the rate search's
procedure, ``rate_search.search_rates``, over the scale instead of a rate). The answer is the fastest scale that
held with the bracket the search left it in (``slo_max_time_scale``, ``slo_max_time_scale_interval``); a
client-bound step stops the search, said so. Every step is kept (``slo_replay_search_steps``) and its requests in
requests.parquet (phase ``step<k>``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from ..core import fmt
from ..core.table import Table
from ..measure import slo
from .base import Cell, CellRun, Column, Measured, register, sampling_of
from .rate_search import answer_cells, answered, search_rates
from .replay import Replay
from .slo_search import TargetSearch


@register
class ReplaySearch(TargetSearch):
    name = "replay_search"
    order = 11
    by_hand = False
    title = "Replay search"
    blurb = ("the fastest time scale at which a trace's replay meets a latency target, searched within one job "
             "(doubling, then bisection to the resolution), with the interval the search leaves it in")
    concurrency_in_id = False
    open_loop = True
    reads_trace = True
    matrix_columns = (
        Column("slo_max_time_scale", "ratio", "`slo_max_time_scale`",
               "replay searches: the fastest time scale at which the target held"),
        Column("slo_max_time_scale_interval", "ratio", "`slo_max_time_scale_interval`",
               "replay searches: the bracket the search left the fastest time scale in"),
        Column("slo_replay_search_steps", "JSON", "`slo_replay_search_steps`",
               "replay searches: every step (time scale, achieved rate, requests, attainment, TTFT at the percentile, "
               "goodput, held or client-bound)"),
    )

    def expand(self, server_id: str, block: dict[str, Any]) -> list[Cell]:
        options = {k: block[k] for k in ("slo", "target", "start_scale", "max_scale", "resolution", "token_scale",
                                         "start_s", "sample", "seed", "lag_limit_ms", "min_achieved")}
        options["window_s"] = block.get("duration_s")
        return [Cell(server_id, self.name, ctx, 0, block["max_tokens"], corpus=block["trace"],
                     sampling=sampling_of(block), options=json.dumps(options, sort_keys=True))
                for ctx in block["contexts"]]

    id_pattern = r"-for-[a-z][a-z0-9_]*"

    def id_suffix(self, cell: Cell) -> str:
        return f"-for-{cell.opts['slo']}"

    async def prepare(self, run: CellRun) -> tuple[list, list, int]:
        return await Replay.prepare(self, run)

    def requests(self, run: CellRun):
        return Replay.requests(self, run)

    async def measure(self, run: CellRun, prepared: tuple[list, list, int]) -> Measured:
        o = run.cell.opts
        target = slo.target(o["slo"], o["target"])
        fit, prompts, skipped = prepared
        run.progress(f"replay search: fastest time scale up to x{o['max_scale']:g} where {target.name} "
                     f"({target.describe()}) holds, {len(fit)} requests of the trace a step")
        sent = {"n": 0}

        async def probe(scale: float, k: int):
            # every step sends the window's requests; fresh prompts (another salt) so no step finds the last
            # step's blocks cached
            step_run = replace(run, salt_extra=f"step{k}")
            _, step_prompts, _ = await Replay.prepare(self, step_run)
            recs, figures = await Replay.replay(self, step_run, fit, step_prompts, scale, f"step{k}", sent["n"])
            sent["n"] += len(recs)
            return recs, figures["span_s"] or 0.0, figures

        found = await search_rates(probe, target, float(o["start_scale"]), float(o["max_scale"]),
                                   float(o["resolution"]), run.progress, show=lambda scale: f"time x{scale:g}",
                                   load="time_scale")
        measured = answered(found, target, "time_scale", "slo_replay_search_steps")
        measured.figures["trace_prompts_skipped"] = skipped
        return measured

    def matrix_fields(self, cell: dict[str, Any], result: dict[str, Any],
                      provenance: dict[str, Any]) -> dict[str, Any]:
        steps, interval = result.get("slo_replay_search_steps"), result.get("slo_max_time_scale_interval")
        return {"slo_max_time_scale": result.get("slo_max_time_scale"),
                "slo_max_time_scale_interval": json.dumps(interval) if interval else None,
                "slo_replay_search_steps": json.dumps(steps) if steps else None,
                "slo_search_stopped": result.get("slo_search_stopped"),
                "trace_prompts_skipped": result.get("trace_prompts_skipped")}

    def cell_label(self, row: Any) -> str:
        return f"replay search / {row.corpus}"

    def report_table(self, m) -> Table:
        t = Table(["Trace", "Target", "Step", "Time scale", "Requests", "Achieved req/s", "Attainment",
                   "TTFT at pct", "Goodput tok/s", "Holds"])
        for r in m.sort_values("corpus").itertuples():
            steps = json.loads(r.slo_replay_search_steps) if isinstance(r.slo_replay_search_steps, str) else []
            for s in steps:
                t.add(r.corpus, r.slo, s["step"], f"x{fmt.num(s['time_scale'])}", s["requests"],
                      fmt.num(s["achieved_rate_rps"]), fmt.pct(s["attainment"]), fmt.ms(s["p_ttft_ms"]),
                      fmt.num(s["goodput_tok_s"]),
                      "client-bound" if s["holds"] is None else ("yes" if s["holds"] else "no"))
            if steps:
                answer, why = answer_cells(r.slo_max_time_scale, r.slo_max_time_scale_interval, r.slo_search_stopped,
                                           lambda v: f"x{fmt.num(v)}")
                t.add(r.corpus, r.slo, "answer", answer, "", "", "", "", "", why)
        return t

