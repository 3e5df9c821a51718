"""Session search: how many users holding multi-turn conversations at once the deployment serves under a latency
target, found in one cell's job.

Each step runs that many users, each one session of the block's turns (``workloads.sessions``: the history
resent every turn, a think time between turns), and judges the target on every turn's request by its
percentile rule (``speedmatrix.measure.slo``), as the concurrency search does (``slo_search.search``: doubling from one
user until the target fails or ``max_users``, then bisection between the highest number that held and the lowest
that failed; a step near a limit measured twice). Every step is kept (``slo_search_steps``; its requests in
requests.parquet, phase ``step<k>``, with their session and turn); the cell's figures are the answer's step's.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from ..core import fmt
from ..measure import slo, stats
from .base import Cell, CellRun, Measured, register, sampling_of
from .sessions import SessionLoad, converse
from .slo_search import SloSearch, TargetSearch, search, searched


@register
class SessionSearch(SessionLoad, TargetSearch):
    name = "session_search"
    order = 10
    by_hand = False
    title = "Session search"
    blurb = ("the most users holding multi-turn conversations at once under a latency target, searched within one "
             "job (doubling, then bisection; a step near a limit measured twice)")
    searches = True
    matrix_columns = ()  # its answer and steps are the concurrency search's columns

    def expand(self, server_id: str, block: dict[str, Any]) -> list[Cell]:
        options = {k: block[k] for k in ("turns", "turn_tokens", "think_s", "think", "ramp_s", "seed")}
        options.update(slo=block["slo"], target=block["target"], margin=float(block["margin"]))
        return [Cell(server_id, self.name, ctx, int(block["max_users"]), block["max_tokens"],
                     requests=block["turns"], corpus=block["corpus"], sampling=sampling_of(block),
                     options=json.dumps(options, sort_keys=True))
                for ctx in block["contexts"]]

    id_pattern = r"-for-[a-z][a-z0-9_]*-turns[0-9]+"

    def id_suffix(self, cell: Cell) -> str:
        return f"-for-{cell.opts['slo']}-turns{cell.opts['turns']}"


    async def prepare(self, run: CellRun) -> None:
        return None

    async def measure(self, run: CellRun, _prepared: None) -> Measured:
        cell, o = run.cell, run.cell.opts
        target = slo.target(o["slo"], o["target"])
        run.progress(f"session search: most users up to {cell.concurrency} at once where {target.name} "
                     f"({target.describe()}) holds over every turn, {o['turns']} turns a session")
        sent = {"n": 0}

        async def probe(users: int, _n: int, k: int):
            first = sent["n"]
            sent["n"] += users
            return await converse(run, users, first=first, phase=f"step{k}")

        answer, steps, batches = await search(probe, target, cell.concurrency, 1, float(o["margin"]), run.progress,
                                              noun="users")
        at = next((s for s in reversed(steps) if s.holds and s.concurrency == answer), steps[0])
        records = [r for k in sorted(batches) for r in batches[k]]
        figures = stats.fixed(batches[at.step], at.window_s)
        figures.update({**searched(records, [s.window_s for s in steps]), "slo_max_concurrency": answer,
                        "slo_search_upper": cell.concurrency, "slo_search_phase": at.phase,
                        "slo_search_window_s": at.window_s, "slo_search_steps": [asdict(s) for s in steps],
                        "slo_target": target.as_dict()})
        return Measured(figures, records)

    def matrix_fields(self, cell: dict[str, Any], result: dict[str, Any],
                      provenance: dict[str, Any]) -> dict[str, Any]:
        return SloSearch.matrix_fields(self, cell, result, provenance)

    def cell_label(self, row: Any) -> str:
        return f"sessions ≤ {int(row.concurrency)} users / {fmt.ctx(int(row.context_tokens))}"

    def report_table(self, m):
        t = SloSearch.report_table(self, m)
        t.columns[3] = "Users"
        return t
