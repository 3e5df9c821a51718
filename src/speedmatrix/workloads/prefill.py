"""Prefill: single requests, one at a time, one output token each, a unique prompt each (seed 002)."""

from __future__ import annotations

from typing import Any

from ..core import fmt
from ..core.table import Table
from ..measure import client, stats
from .base import Cell, CellRun, Measured, Workload, register


@register
class Prefill(Workload):
    name = "prefill"
    published = "rows"
    slo = False  # one-token requests: a prompt-length TTFT, no goodput to speak of
    order = 0
    title = "Prefill"
    blurb = "prompt tok/s by context length"
    one_at_a_time = True
    headline_tok_s = "prompt_tok_s"
    stability_figure = "prompt_tok_s"

    def expand(self, server_id: str, block: dict[str, Any]) -> list[Cell]:
        return [Cell(server_id, self.name, ctx, 1, 1, requests=block["requests"],
                     corpus=block["corpus"], repeats=block.get("repeats", 1))
                for ctx in block["contexts"]]

    def request_max_tokens(self, cell: Cell) -> int:
        return 1

    async def measure(self, run: CellRun, prompts: list) -> Measured:
        cell = run.cell
        run.progress(f"prefill: {cell.requests} single requests at context {cell.context_tokens}")
        records = await client.sequential(run.url, run.model, prompts, run.opts)
        return Measured(stats.prefill(records, cell.context_tokens), records)

    def report_table(self, m) -> Table:
        t = Table(["Context", "prompt tok/s", "TTFT"])
        for r in m.sort_values("context_tokens").itertuples():
            t.add(fmt.ctx(int(r.context_tokens)), fmt.num(r.prompt_tok_s), fmt.ms(r.ttft_ms))
        return t
