"""Prefix cache: requests sharing part of their context, a cold pass then a warm pass (seed 000)."""

from __future__ import annotations

from typing import Any

from ..core import fmt
from ..core.status import Status
from ..core.table import Table
from ..measure import client, metrics, stats
from .base import Cell, CellRun, Column, Measured, Workload, register, sampling_of

PASSES = ("cold", "warm")


@register
class PrefixCache(Workload):
    name = "prefix_cache"
    order = 3
    title = "Prefix cache"
    blurb = ("a share of every prompt is the same text; the cold pass meets an empty cache for it, the warm "
             "pass (new requests, same shared part) finds it cached. Token hit rate from the server's "
             "prefix-cache counters.")
    shared_prefix = True
    cache_state = ("a new shared part per cell (its own nonce): the cold pass finds none of it cached, the warm "
                   "pass what the cold pass left")
    # the main columns are the warm pass, these the cold pass
    matrix_columns = (
        Column("cold_ttft_ms", "ms", "`passes.cold`",
               "prefix cache: the cold pass's median TTFT"),
        Column("cold_mean_ttft_ms", "ms", "`passes.cold`",
               "prefix cache: the cold pass's mean TTFT"),
        Column("cold_total_tok_s", "tok/s", "`passes.cold.output_throughput`", "prefix cache: the cold pass"),
        Column("cold_prefix_cache_hit_rate", "fraction", "`passes.cold`", "prefix cache: the cold pass's hit rate"),
    )

    def expand(self, server_id: str, block: dict[str, Any]) -> list[Cell]:
        return [Cell(server_id, self.name, ctx, c, block["max_tokens"], requests=block["requests"],
                     shared_prefix=float(share), corpus=block["corpus"],
                     repeats=block.get("repeats", 1), sampling=sampling_of(block))
                for share in block["shared_prefix"] for ctx in block["contexts"] for c in block["concurrency"]]

    def shared_tokens(self, cell: Cell) -> int:
        return round(cell.shared_prefix * cell.context_tokens)

    async def prepare(self, run: CellRun) -> dict[str, list]:
        """Both passes' prompts, all in one format: a text prompt is tokenized by the server (its BOS first, its
        own merges), so a text prompt and an id prompt share no cached block even where their ids agree. Where
        any prompt cannot be made exact as text, every prompt of the cell goes as ids."""
        cell, shared, n = run.cell, self.shared_tokens(run.cell), run.cell.requests
        ids = [run.source.shared_prefix_prompt(i, cell.context_tokens, shared, run.salt) for i in range(2 * n)]
        made = await run.build(ids)
        formats = {getattr(p, "format", "token_ids") for p in made}
        if len(formats) > 1:
            run.progress("some prompts could not be made exact as text: the cell sends every prompt as token ids "
                         "(a text prompt and an id prompt share no cached block)")
            made = ids
        return {phase: made[k * n:(k + 1) * n] for k, phase in enumerate(PASSES)}

    async def measure(self, run: CellRun, by_phase: dict[str, list]) -> Measured:
        cell, shared = run.cell, self.shared_tokens(run.cell)
        records, passes = [], {}
        snap = metrics.snapshot(run.before_raw)
        for k, phase in enumerate(PASSES):
            run.progress(f"prefix cache, {phase} pass: {cell.requests} requests, {cell.concurrency} at once, "
                         f"{shared} of {cell.context_tokens} tokens shared")
            first = k * cell.requests
            wall, recs = await client.fixed_count(run.url, run.model,
                                                  lambda i, ps=by_phase[phase], f=first: ps[i - f],
                                                  cell.requests, cell.concurrency, run.opts, phase=phase,
                                                  first_index=first)
            after = metrics.snapshot(await run.scrape())
            passes[phase] = {**stats.fixed(recs, wall), **metrics.delta(snap, after),
                             "client_output_tokens": sum(r.output_tokens for r in recs)}
            snap = after
            records += recs
        figures = {k: v for k, v in passes["warm"].items() if k not in metrics.DELTA_KEYS}
        figures["shared_prefix_tokens"] = shared
        return Measured(figures, records, passes)

    def matrix_fields(self, cell: dict[str, Any], result: dict[str, Any],
                      provenance: dict[str, Any]) -> dict[str, Any]:
        cold = (result.get("passes") or {}).get("cold", {})
        return {"cold_ttft_ms": cold.get("median_ttft_ms"), "cold_mean_ttft_ms": cold.get("mean_ttft_ms"),
                "cold_total_tok_s": cold.get("output_throughput"),
                "cold_prefix_cache_hit_rate": cold.get("prefix_cache_hit_rate")}

    def slo_scope(self, result: dict[str, Any]) -> tuple[str | None, float | None]:
        return "warm", None  # the headline pass (its measured_s is the cell's)

    def phase(self, row: Any) -> str:
        return f"Prefix cache {fmt.share(row.shared_prefix)} (warm)"

    def cell_label(self, row: Any) -> str:
        return f"{super().cell_label(row)} / {fmt.share(row.shared_prefix)} shared"

    def report_table(self, m) -> Table:
        """Seed 000's prefix-cache table: a cold and a warm row per sharing ratio."""
        t = Table(["Scenario", "Context", "Concurrency", "Mean TTFT", "Median TTFT", "tok/s", "Token hit rate"])
        for r in m.sort_values(["shared_prefix", "context_tokens", "concurrency"],
                               ascending=[False, True, True]).itertuples():
            share = fmt.share(r.shared_prefix)
            ctx, conc = fmt.ctx(int(r.context_tokens)), int(r.concurrency)
            if r.status == Status.OVER_CAPACITY:
                t.add(f"Shared prefix {share}", ctx, conc, "Over capacity", "", "", "")
                continue
            t.add(f"Shared prefix {share} — cold", ctx, conc, fmt.ms(r.cold_mean_ttft_ms), fmt.ms(r.cold_ttft_ms),
                  fmt.num(r.cold_total_tok_s), fmt.pct(r.cold_prefix_cache_hit_rate))
            t.add(f"Shared prefix {share} — warm", ctx, conc, fmt.ms(r.mean_ttft_ms), fmt.ms(r.ttft_ms),
                  fmt.num(r.total_tok_s), fmt.pct(r.prefix_cache_hit_rate))
        return t
