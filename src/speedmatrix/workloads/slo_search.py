"""SLO search: the highest concurrency at which a latency target still holds, found in one cell's job.

The search (``search``) probes concurrency 1, 2, 4, ... until the target fails or the upper bound is
reached, then bisects between the highest concurrency that held and the lowest that failed until they
are adjacent. Each step sends ``requests`` requests (at least twice its concurrency) at that concurrency,
output capped, as a capacity cell does, and decides by the target's percentile rule (speedmatrix.measure.slo).
Near the boundary a single batch is not enough to decide: when a step's percentile lies within
``margin`` (default 10 %) of a limit, the step is measured once more and decided on both batches.
Every step is kept in the cell's result (``slo_search_steps``) and its requests in requests.parquet
(phase ``step<k>``). The cell's figures are those of the step at the answer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from ..core import fmt
from ..core.settings import defaults_of
from ..core.table import Table
from ..measure import client, slo, stats
from ..measure import records as requests_table
from . import search as engine
from .base import Cell, CellRun, Column, Measured, Workload, register, sampling_of


@dataclass
class Step:
    step: int
    concurrency: int
    requests: int
    window_s: float
    holds: bool
    rechecked: bool
    attainment: float | None
    p_ttft_ms: float | None
    p_tpot_ms: float | None
    p_e2e_ms: float | None
    goodput_tok_s: float | None
    output_tok_s: float | None

    @property
    def phase(self) -> str:
        return f"step{self.step}"


def frame(records: list[client.RequestRecord]) -> pd.DataFrame:
    """The columns a latency target reads (``slo.READS``), from request records as the requests table has them."""
    return requests_table.frame(records, slo.READS)


def near_limit(figures: dict[str, Any], target: slo.Target, margin: float) -> bool:
    """A percentile within ``margin`` of its limit: one batch cannot tell which side it is on."""
    for key, lim in target.limits().items():
        p = figures.get(f"p_{key}")
        if p is not None and math.isfinite(p) and abs(p - lim) <= margin * lim:
            return True
    return False


Probe = Callable[[int, int, int], Awaitable[tuple[float, list[client.RequestRecord]]]]


async def search(probe: Probe, target: slo.Target, upper: int, requests: int, margin: float,
                 progress: Callable[[str], None] = print, noun: str = "concurrency"
                 ) -> tuple[int, list[Step], dict[int, list]]:
    """(highest concurrency that held, 0 if none; every step; each step's records): the one search
    (``workloads.search``) over a whole number. ``probe(concurrency, requests, step)`` measures one batch and
    returns (wall seconds, records)."""
    steps: list[Step] = []
    batches: dict[int, list] = {}

    async def step(load: float) -> bool:
        c = int(load)
        k = len(steps) + 1
        n = max(requests, 2 * c)
        wall, recs = await probe(c, n, k)
        figures = slo.evaluate(frame(recs), target, wall)
        rechecked = False
        if near_limit(figures, target, margin):
            more_wall, more = await probe(c, n, k)
            wall, recs, rechecked = wall + more_wall, recs + more, True
            figures = slo.evaluate(frame(recs), target, wall)
        holds = bool(figures["slo_met"])
        tokens = sum(r.output_tokens for r in recs if not r.error)
        steps.append(Step(k, c, len(recs), wall, holds, rechecked, figures["attainment"], figures["p_ttft_ms"],
                          figures["p_tpot_ms"], figures["p_e2e_ms"], figures["goodput_tok_s"],
                          tokens / wall if wall > 0 else None))
        batches[k] = recs
        progress(f"search step {k}: {noun} {c}, {len(recs)} requests, "
                 f"{'holds' if holds else 'misses'} {target.name}"
                 + (" (near a limit: measured twice)" if rechecked else ""))
        return holds

    found = await engine.search(step, 1, upper, engine.COUNT)
    return int(found.answer), steps, batches


def searched(records: list[client.RequestRecord], windows: list[float]) -> dict[str, Any]:
    """What a search cell sent over all its steps (requests.parquet holds every step's requests)."""
    return {"num_requests": len(records), "completed": sum(1 for r in records if not r.error),
            "failed": sum(1 for r in records if r.error), "measured_s": sum(windows)}


class TargetSearch(Workload):
    """A kind that searches for the load at which its own latency target holds: judged on its own target only,
    on the requests of the step at its answer (``slo_search_phase``, ``slo_search_window_s``)."""

    loads_follow_run = True

    def slo_targets(self, cell: dict[str, Any], targets: list) -> list:
        mine = (cell.get("options") or {}).get("slo")
        return [t for t in targets if t.name == mine]

    def slo_scope(self, result: dict[str, Any]) -> tuple[str | None, float | None]:
        return result.get("slo_search_phase"), result.get("slo_search_window_s")


@register
class SloSearch(TargetSearch):
    name = "slo_search"
    order = 5
    title = "SLO search"
    blurb = ("the highest concurrency at which a latency target holds, searched within one job "
             "(doubling, then bisection; a step near a limit measured twice)")
    searches = True
    matrix_columns = (
        Column("slo_max_concurrency", "requests", "`slo_max_concurrency`",
               "slo_search: the highest concurrency at which the target held (0: not even one request at a time); "
               "session_search: the most users at once"),
        Column("slo_search_steps", "JSON", "`slo_search_steps`",
               "slo_search and session_search: every step (concurrency or users, requests, attainment, percentiles, "
               "holds, measured twice)"),
    )

    def expand(self, server_id: str, block: dict[str, Any]) -> list[Cell]:
        options = {"slo": block["slo"], "target": block["target"], "margin": float(block["margin"])}
        return [Cell(server_id, self.name, ctx, int(block["max_concurrency"]), block["max_tokens"],
                     requests=block["requests"], corpus=block["corpus"],
                     repeats=block.get("repeats", 1), sampling=sampling_of(block),
                     options=json.dumps(options, sort_keys=True))
                for ctx in block["contexts"]]

    def manual_cell(self, context: int, concurrency: int, requests: int, max_tokens: int, duration_s: float,
                    shared_prefix: float, corpus: str, repeats: int = 1, target: dict[str, Any] | None = None) -> Cell:
        """``speedmatrix measure --workload slo_search``: --concurrency is the search's upper bound."""
        if not target:
            raise ValueError("slo_search needs a latency target: --slo-ttft-ms, --slo-tpot-ms, --slo-e2e-ms "
                             "(and --slo-percentile), or --slo-preset")
        t = slo.target("manual", target, "speedmatrix measure")
        block = {"contexts": [context], "max_concurrency": concurrency, "requests": requests,
                 "max_tokens": max_tokens, "corpus": corpus, "repeats": repeats,
                 **({"margin": target["margin"]} if "margin" in target else {})}
        return self.expand("manual", {**defaults_of(self.name, block), "slo": t.name, "target": t.as_dict()})[0]

    id_pattern = r"-for-[a-z][a-z0-9_]*"

    def id_suffix(self, cell: Cell) -> str:
        return f"-for-{cell.opts['slo']}"

    def needed_kv_tokens(self, cell: Cell) -> int:
        return cell.context_tokens + cell.max_tokens  # one request; the search stops below the KV cache

    async def prepare(self, run: CellRun) -> None:
        return None  # each step builds its own prompts before its clock starts

    async def measure(self, run: CellRun, _prepared: None) -> Measured:
        cell, o = run.cell, run.cell.opts
        target = slo.target(o["slo"], o["target"])
        per_request = cell.context_tokens + cell.max_tokens
        upper = cell.concurrency
        if run.kv_tokens:  # no step may be over capacity
            upper = max(1, min(upper, run.kv_tokens // per_request))
        run.progress(f"slo_search: highest concurrency up to {upper} where {target.name} ({target.describe()}) "
                     f"holds, context {cell.context_tokens}, cap {cell.max_tokens} tokens")
        sent = {"n": 0}

        async def probe(c: int, n: int, k: int) -> tuple[float, list[client.RequestRecord]]:
            first = sent["n"]
            prompts = await run.build([run.source.prompt(i, cell.context_tokens, run.salt)
                                       for i in range(first, first + n)])
            sent["n"] += n
            return await client.fixed_count(run.url, run.model, lambda i: prompts[i - first], n, c, run.opts,
                                            phase=f"step{k}", first_index=first)

        answer, steps, batches = await search(probe, target, upper, cell.requests, float(o["margin"]),
                                              run.progress)
        at = next((s for s in reversed(steps) if s.holds and s.concurrency == answer), steps[0])
        records = [r for k in sorted(batches) for r in batches[k]]
        figures = stats.fixed(batches[at.step], at.window_s)
        figures.update({
            **searched(records, [s.window_s for s in steps]),  # the rates are the answer's step's
            "slo_max_concurrency": answer,
            "slo_search_upper": upper,
            "slo_search_phase": at.phase,
            "slo_search_window_s": at.window_s,
            "slo_search_steps": [asdict(s) for s in steps],
            "slo_target": target.as_dict(),
        })
        return Measured(figures, records)

    def matrix_fields(self, cell: dict[str, Any], result: dict[str, Any],
                      provenance: dict[str, Any]) -> dict[str, Any]:
        steps = result.get("slo_search_steps")
        return {"slo_max_concurrency": result.get("slo_max_concurrency"),
                "slo_search_steps": json.dumps(steps) if steps else None}

    def cell_label(self, row: Any) -> str:
        return f"search ≤ c{int(row.concurrency)} / {fmt.ctx(int(row.context_tokens))}"

    def report_table(self, m) -> Table:
        t = Table(["Context", "Target", "Step", "Concurrency", "Requests", "Attainment", "TTFT at pct", "TPOT at pct",
                   "Output tok/s", "Holds"])
        for r in m.sort_values("context_tokens").itertuples():
            for s in json.loads(r.slo_search_steps) if isinstance(r.slo_search_steps, str) else []:
                t.add(fmt.ctx(int(r.context_tokens)), r.slo, s["step"], s["concurrency"], s["requests"],
                      fmt.pct(s["attainment"]) if s["attainment"] is not None else "—", fmt.ms(s["p_ttft_ms"]),
                      fmt.time_ms(s["p_tpot_ms"]), fmt.num(s["output_tok_s"]),
                      ("yes" if s["holds"] else "no") + (" (measured twice)" if s["rechecked"] else ""))
        return t
