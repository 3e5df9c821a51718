"""Sustained decode: N requests in flight for a window (fixed, or until output tok/s is precise enough:
speedmatrix.measure.precision), each finished one replaced at once (seed 002)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from ..core import fmt
from ..core.status import Status
from ..core.table import Table
from ..measure import client, precision, stats, telemetry
from .base import Cell, CellRun, Column, Measured, Workload, register, sampling_of

FOOTNOTE = (
    "Looped: the model kept repeating the same text, so this measurement is discarded under the configured "
    "policy. Over capacity: not run because this many requests at this context would exceed the server's KV "
    "cache (decided from the live server's `kv_cache_size_tokens`). Unstable: the cell's repeats spread more "
    "than `stability.max_cv` allows (the figure shown is their median)."
)


class PromptQueue:
    """Decode prompts built ahead: a first batch before the window, then a producer keeps at least
    ``concurrency`` spare ones ready, so a finished request is replaced at once. The producer makes its
    prompts with the model's tokenizer on this machine (``CellRun.build_in_window``), not with calls to
    the server being measured; only without a local tokenizer does it fall back to the server, and the
    cell counts those prompts (``prompts_built_by_server_in_window``)."""

    def __init__(self, run: CellRun) -> None:
        self.run = run
        self.queue: asyncio.Queue = asyncio.Queue()
        self.built = 0

    async def fill(self, n: int, in_window: bool = False) -> None:
        r = self.run
        ids = [r.source.prompt(i, r.cell.context_tokens, r.salt) for i in range(self.built, self.built + n)]
        make = r.build_in_window if in_window and r.build_in_window else r.build
        for p in await make(ids):
            self.queue.put_nowait(p)
        self.built += n

    async def producer(self) -> None:
        c = self.run.cell.concurrency
        while True:
            if self.queue.qsize() < 2 * c + 8:
                await self.fill(max(8, c), in_window=True)
            else:
                await asyncio.sleep(0.05)

    async def next(self, _index: int):
        return await self.queue.get()


@register
class Decode(Workload):
    name = "decode"
    order = 4
    title = "Sustained decode"
    blurb = "total tok/s · rows are context length, columns are simultaneous requests"
    footnote = FOOTNOTE
    throughput = True
    headline = True
    published = "grid"
    cut_at_window_end = True
    roofline = True
    matrix_columns = (
        Column("roofline_bound_ms", "ms", "derived", "decode at c1: weights over peak bandwidth"),
        Column("roofline_peak_bw_tb_s", "TB/s", "data/gpu_peaks.yaml", "the GPU's peak memory bandwidth"),
        Column("roofline_pct", "%", "derived", "the bound as a share of the measured time between tokens"),
        # the stopping rule (speedmatrix.measure.precision; the experiment's `precision:`)
        Column("precision_stop", "—", "`precision_stop`",
               "why the cell stopped measuring: precise; fixed (the rule off: a published method's window); "
               "max_window, max_repeats or too_few_requests (Unstable where the rule is on)"),
        Column("precision_reached", "fraction", "`precision_reached`",
               "the relative half-width of output tok/s's interval the cell reached: ten batch means of each of its "
               "windows, pooled over its repeats, at the level of each of the rule's looks"),
        Column("precision_target", "fraction", "`precision_target`", "the rule's target (empty: the rule off)"),
        Column("repeats_measured", "count", "`repeats_measured`", "the repeats the cell measured, at most `repeats`"),
    )
    PRECISION = ("precision_stop", "precision_reached", "precision_target", "repeats_measured")

    def expand(self, server_id: str, block: dict[str, Any]) -> list[Cell]:
        rule = precision.Precision.of(block["precision"]).as_dict() if "precision" in block else None
        return [Cell(server_id, self.name, ctx, c, block["max_tokens"], float(block["duration_s"]),
                     corpus=block["corpus"], repeats=block.get("repeats", 1), sampling=sampling_of(block),
                     precision=json.dumps(rule, sort_keys=True) if rule else "")
                for ctx in block["contexts"] for c in block["concurrency"]]

    async def prepare(self, run: CellRun) -> PromptQueue:
        queue = PromptQueue(run)
        await queue.fill(4 * run.cell.concurrency + 16)
        return queue

    async def measure(self, run: CellRun, queue: PromptQueue) -> Measured:
        cell, opts = run.cell, run.opts
        rule = precision.Precision.of({"enabled": False, **cell.precision_settings})
        # the cell's windows so far are pooled; the window may end early once the cell has its fewest repeats
        earlier = [f for f in run.earlier if f.get("precision_batches") is not None]
        may_close = rule.enabled and run.repeat >= rule.min_repeats
        looks: list[dict] = []

        async def watch(window: client.Window, records: list[client.RequestRecord]) -> None:
            """The stopping rule as the window runs: from steady state, a look at each of its times (no work per
            streamed event); the first precise one ends the window."""
            while (t_s := stats.steady_start(records, cell.concurrency)) is None:
                await asyncio.sleep(0.05)
            for at in precision.looks_at(t_s, cell.duration_s, rule):
                await asyncio.sleep(max(0.0, window.t0 + at - time.monotonic()))
                looks.append(precision.window_look(records, t_s, time.monotonic() - window.t0, rule, cell.repeats,
                                                   earlier))
                if looks[-1]["precise"]:
                    run.progress(f"precise at {looks[-1]['at_s']:.1f} s: output tok/s within "
                                 f"±{looks[-1]['relative_half_width']:.1%} (target ±{rule.output_tok_s:.1%})")
                    window.close()
                    return

        run.progress(f"decode: {cell.concurrency} at once for " + (
            f"{min(rule.min_window_s, cell.duration_s):g} to {cell.duration_s:g} s (until output tok/s is within "
            f"±{rule.output_tok_s:.1%})" if may_close else f"{cell.duration_s:g} s")
            + f", context {cell.context_tokens}")
        filling = asyncio.create_task(queue.producer())
        try:
            window, records = await asyncio.wait_for(
                client.closed_loop(run.url, run.model, queue.next, cell.concurrency, cell.duration_s, opts,
                                   run.progress, watch if may_close else None),
                timeout=float(run.client.cell_timeout_s or cell.duration_s + opts.stall_timeout_s + 120),
            )
        finally:
            filling.cancel()
        duration = window.end - window.t0
        figures = stats.decode(records, duration, cell.concurrency)
        figures["prompts_built"] = queue.built
        final = precision.window_look(records, stats.steady_start(records, cell.concurrency), duration, rule,
                                      cell.repeats, earlier)
        figures.update(precision.window_figures(rule, final, len(looks)))
        return Measured(figures, records)

    def matrix_fields(self, cell: dict[str, Any], result: dict[str, Any],
                      provenance: dict[str, Any]) -> dict[str, Any]:
        """The stopping rule's outcome; at concurrency 1, the memory-bandwidth bound per token against the measured
        time."""
        out = {k: result.get(k) for k in self.PRECISION}
        if cell["concurrency"] != 1:
            return out
        r = telemetry.roofline(provenance.get("model_weights_gib"), result.get("gpu_name"),
                               result.get("median_tbt_ms"))
        return {**out, **{k: (r or {}).get(k) for k in self.column_names() if k not in self.PRECISION}}

    def report_table(self, m) -> Table:
        """Seed 002's "Sustained decode" table: rows = context, columns = concurrency."""
        d = m.assign(_p=(m["corpus"] != "prose")).sort_values("_p", kind="stable")  # prose first where both
        concs = sorted(d["concurrency"].unique())
        t = Table(["Context", *(str(c) for c in concs)])
        for ctx in sorted(d["context_tokens"].unique()):
            row = [fmt.ctx(int(ctx))]
            for c in concs:
                hit = d[(d["context_tokens"] == ctx) & (d["concurrency"] == c)]
                if hit.empty:
                    row.append("")
                    continue
                r = hit.iloc[0]
                if r["status"] == Status.VALID:
                    row.append(fmt.num(r["total_tok_s"]))
                elif r["status"] == Status.UNSTABLE:
                    row.append(f"{fmt.num(r['total_tok_s'])} (Unstable)")
                else:
                    row.append(fmt.status(r["status"]))
            t.add(*row)
        return t
