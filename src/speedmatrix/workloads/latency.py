"""Latency: requests one at a time, TTFT across input sizes (seed 000's latency profile)."""

from __future__ import annotations

import time
from typing import Any

from ..core import fmt
from ..core.table import Table
from ..measure import client, stats
from .base import Cell, CellRun, Measured, Workload, register, sampling_of


@register
class Latency(Workload):
    name = "latency"
    order = 1
    title = "Latency"
    blurb = "one request at a time, TTFT across input sizes"
    one_at_a_time = True
    stability_figure = "median_ttft_ms"

    def expand(self, server_id: str, block: dict[str, Any]) -> list[Cell]:
        return [Cell(server_id, self.name, ctx, 1, block["max_tokens"], requests=block["requests"],
                     corpus=block["corpus"], repeats=block.get("repeats", 1), sampling=sampling_of(block))
                for ctx in block["contexts"]]

    async def measure(self, run: CellRun, prompts: list) -> Measured:
        cell = run.cell
        run.progress(f"latency: {cell.requests} requests one at a time, context {cell.context_tokens}")
        t0 = time.monotonic()
        records = await client.sequential(run.url, run.model, prompts, run.opts)
        return Measured(stats.fixed(records, time.monotonic() - t0), records)

    def report_table(self, m) -> Table:
        t = Table(["Input tokens", "Median TTFT", "Mean TTFT", "p95 TTFT", "tok/s (one request)"])
        for r in m.sort_values("context_tokens").itertuples():
            t.add(fmt.integer(r.context_tokens), fmt.ms(r.ttft_ms), fmt.ms(r.mean_ttft_ms), fmt.ms(r.p95_ttft_ms),
                  fmt.num(r.per_request_tok_s))
        return t
