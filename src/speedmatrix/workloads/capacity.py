"""Capacity: N requests, c at once, output capped (seed 003's capacity harness)."""

from __future__ import annotations

from typing import Any

from ..core import fmt
from ..core.status import Status
from ..core.table import Table
from ..measure import client, stats
from .base import Cell, CellRun, Measured, Workload, register, sampling_of


@register
class Capacity(Workload):
    name = "capacity"
    order = 2
    title = "Capacity"
    blurb = "a fixed number of requests at each concurrency, output capped"
    throughput = True
    reference = True  # vllm bench serve sends N requests at a concurrency, output capped: the same shape

    def expand(self, server_id: str, block: dict[str, Any]) -> list[Cell]:
        return [Cell(server_id, self.name, ctx, c, block["max_tokens"], requests=block["requests"],
                     corpus=block["corpus"], repeats=block.get("repeats", 1), sampling=sampling_of(block))
                for ctx in block["contexts"] for c in block["concurrency"]]

    async def measure(self, run: CellRun, prompts: list) -> Measured:
        cell = run.cell
        run.progress(f"capacity: {cell.requests} requests, {cell.concurrency} at once, context "
                     f"{cell.context_tokens}, cap {cell.max_tokens} tokens")
        wall, records = await client.fixed_count(run.url, run.model, lambda i: prompts[i], cell.requests,
                                                 cell.concurrency, run.opts)
        return Measured(stats.fixed(records, wall), records)

    def report_table(self, m) -> Table:
        t = Table(["Context", "Concurrency", "Status", "Output tok/s", "TTFT p50", "TTFT p95", "Completed"])
        for r in m.sort_values(["context_tokens", "concurrency"]).itertuples():
            ok = r.status != Status.OVER_CAPACITY
            t.add(fmt.ctx(int(r.context_tokens)), int(r.concurrency), fmt.status(r.status),
                  fmt.num(r.total_tok_s) if ok else "—", fmt.ms(r.ttft_ms) if ok else "—",
                  fmt.ms(r.p95_ttft_ms) if ok else "—", fmt.integer(r.completed_requests) if ok else "—")
        return t
