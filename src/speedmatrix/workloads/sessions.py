"""Multi-turn sessions: users holding conversations, each turn sending the whole history again.

A cell is ``users`` (its concurrency) users at once, each running one conversation of ``turns`` turns. Turn 1
sends a prompt of the cell's context; turn k sends the conversation so far (turn k-1's prompt and the answer's
tokens as the server generated them, asked with ``return_token_ids``) followed by a new user message of
``turn_tokens`` tokens, so the server sees exactly the history it computed and prefix reuse is real. The
messages are plain concatenation (the tiny models have no chat template); each is the corpus's text with a
nonce, as every prompt here. Between turns a user thinks: ``think_s`` seconds (``think: fixed``) or drawn
(``exponential`` with that mean, seeded per user and turn). Users start spread evenly over ``ramp_s``.

Per turn: TTFT, prompt length, and the share of the prompt the server served from its prefix cache (each
request's ``cached_tokens``, from the server's usage report: vLLM with ``--enable-prompt-tokens-details``;
without it the cell keeps only its counters' hit rate). Per session: completed (every turn answered) and,
where the block names a latency target (``slo``), met when every one of its turns met the target's limits.
``history_kv_ratio`` is the users' final histories over the server's KV cache: above 1 they cannot all stay
cached, and later turns find their prefix evicted.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from ..core import fmt
from ..core.errors import CellError
from ..core.status import Status
from ..core.table import Table
from ..measure import client, slo, stats
from .base import Cell, CellRun, Column, Measured, Workload, register, sampling_of
from .slo_search import frame


def final_history(cell: Cell) -> int:
    """Tokens of a session's last prompt and its answer (turn messages and answers at their caps)."""
    o = cell.opts
    return cell.context_tokens + (o["turns"] - 1) * (o["turn_tokens"] + cell.max_tokens) + cell.max_tokens


def think_time(o: dict[str, Any], salt: str, user: int, turn: int) -> float:
    if o["think"] == "fixed":
        return float(o["think_s"])
    return random.Random(f"{o['seed']}/{salt}/think/{user}/{turn}").expovariate(1 / o["think_s"]) if o["think_s"] else 0


async def converse(run: CellRun, users: int, first: int = 0, phase: str = "") -> tuple[float, list]:
    """``users`` conversations at once (indexes from ``first``); (wall seconds, every turn's record)."""
    cell, o = run.cell, run.cell.opts
    turns, records = int(o["turns"]), []
    if hasattr(run.source, "conversation"):  # a dataset's conversations: their own later user turns
        opening, messages = map(list, zip(*(run.source.conversation(first + u, cell.context_tokens, run.salt)
                                            for u in range(users))))
    else:
        opening = [run.source.prompt(first + u, cell.context_tokens, run.salt) for u in range(users)]
        messages = [[run.source.prompt(first + u, o["turn_tokens"], f"{run.salt}/turn{k}")
                     for k in range(2, turns + 1)] for u in range(users)]
    opts = replace(run.opts, return_token_ids=True)
    async with client.session_for(users) as http:
        t0 = time.monotonic()

        async def user(u: int) -> None:
            await asyncio.sleep(o["ramp_s"] * u / max(1, users))
            history = list(opening[u])
            for k in range(1, min(turns, len(messages[u]) + 1) + 1):
                prompt = history if k == 1 else history + messages[u][k - 2]
                rec = client.RequestRecord(index=(first + u) * turns + k - 1, worker=u, prompt_tokens=len(prompt),
                                           start=time.monotonic() - t0, phase=phase or f"turn{k}",
                                           session=first + u, turn=k)
                records.append(rec)
                await client.stream_completion(http, run.url, run.model, prompt, opts, rec, t0)
                if rec.error:
                    return  # the conversation cannot go on without its answer
                if rec.output_tokens and not rec.output_ids:
                    raise CellError("the server returned no token ids (return_token_ids): a session's history needs "
                                    "the answer's tokens; vLLM has them from 0.10.2")
                history = prompt + rec.output_ids
                if k <= len(messages[u]) and k < turns:
                    await asyncio.sleep(think_time(o, run.salt, first + u, k))

        await asyncio.gather(*(user(u) for u in range(users)))
        wall = time.monotonic() - t0
    records.sort(key=lambda r: r.index)
    return wall, records


def by_turn(records: list[client.RequestRecord]) -> list[dict[str, Any]]:
    """Each turn's figures over the sessions' requests of that turn."""
    out = []
    for k in sorted({r.turn for r in records}):
        mine = [r for r in records if r.turn == k]
        ok = [r for r in mine if not r.error]
        ttft = [1000 * r.ttft_s for r in ok if r.ttft_s is not None]
        out.append({"turn": k, "requests": len(mine), "failed": len(mine) - len(ok),
                    "prompt_tokens": float(np.mean([r.prompt_tokens for r in mine])),
                    "ttft_p50_ms": stats.percentile(ttft, 50),
                    "ttft_p95_ms": stats.percentile(ttft, 95),
                    "cached_share": stats.cached_share(ok)})
    return out


def by_session(records: list[client.RequestRecord], target: slo.Target | None) -> dict[str, Any]:
    """Sessions completed (no request failed: a failed turn ends its conversation) and, with a target, met (every
    turn within its limits)."""
    sessions = sorted({r.session for r in records})
    failed = {r.session for r in records if r.error}
    done = [s for s in sessions if s not in failed]
    out: dict[str, Any] = {"sessions": len(sessions), "sessions_completed": len(done), "sessions_met_share": None}
    if target is not None and sessions:
        verdict = slo.judge(slo.request_figures(frame(records)), target).eq(True)
        met = pd.Series(verdict.values, index=[r.session for r in records]).groupby(level=0).all()
        out["sessions_met_share"] = float(sum(bool(met.get(s, False)) for s in done) / len(sessions))
    return out


class SessionLoad:
    """What a session's cell asks of the server, for every kind that sends sessions (the sessions and their
    search): its longest request and the KV cache one session needs are its last turn's."""

    def longest_request(self, cell: Cell) -> int:
        return final_history(cell)  # a session's last turn: the conversation so far and its answer

    def needed_kv_tokens(self, cell: Cell) -> int:
        return final_history(cell)  # one session's last turn; more users queue or are evicted


@register
class Sessions(SessionLoad, Workload):
    name = "sessions"
    order = 8
    by_hand = False
    title = "Multi-turn sessions"
    blurb = ("users holding conversations, each turn sending the whole history again: TTFT and the prefix cache's "
             "share of the prompt by turn")
    footnote = ("Cached: the share of a turn's prompt tokens the server served from its prefix cache (its own "
                "per-request report). History/KV: the users' final histories over the KV cache; above 1 they cannot "
                "all stay cached, and later turns find their prefix evicted.")
    matrix_columns = (
        Column("session_turns", "JSON", "`session_turns`",
               "sessions: per turn, requests, failed, mean prompt tokens, TTFT p50/p95 and the cached share of the "
               "prompt"),
        Column("sessions_completed", "sessions", "`sessions_completed`",
               "sessions: conversations whose every turn was answered"),
        Column("sessions_met_share", "fraction", "`sessions_met_share`",
               "sessions with a target (`slo`): the share of sessions whose every turn met the target's limits"),
        Column("history_kv_ratio", "ratio", "`history_kv_ratio`",
               "sessions: the users' final histories (prompt and answer of the last turn, at the caps) over the KV "
               "cache in tokens; above 1 not all can stay cached"),
    )

    def expand(self, server_id: str, block: dict[str, Any]) -> list[Cell]:
        options = {k: block[k] for k in ("turns", "turn_tokens", "think_s", "think", "ramp_s", "seed")}
        if "slo" in block:
            options.update(slo=block["slo"], target=block["target"])
        return [Cell(server_id, self.name, ctx, users, block["max_tokens"], requests=users * block["turns"],
                     corpus=block["corpus"], sampling=sampling_of(block), options=json.dumps(options, sort_keys=True))
                for ctx in block["contexts"] for users in block["users"]]

    id_pattern = r"-turns[0-9]+"

    def id_suffix(self, cell: Cell) -> str:
        return f"-turns{cell.opts['turns']}"


    async def prepare(self, run: CellRun) -> None:
        return None  # a turn's prompt is the conversation so far: made as the session goes

    async def measure(self, run: CellRun, _prepared: None) -> Measured:
        cell, o = run.cell, run.cell.opts
        users = cell.concurrency
        ratio = users * final_history(cell) / run.kv_tokens if run.kv_tokens else None
        run.progress(f"sessions: {users} users x {o['turns']} turns, first prompt {cell.context_tokens} tokens, "
                     f"{o['turn_tokens']} a later message, think {o['think_s']:g} s ({o['think']}); final histories "
                     + (f"{ratio:.2f} x the KV cache" if ratio is not None else "against an unknown KV cache"))
        wall, records = await converse(run, users)
        target = slo.target(o["slo"], o["target"]) if "slo" in o else None
        figures = stats.fixed(records, wall)
        turns = by_turn(records)
        figures.update(by_session(records, target), session_turns=turns, history_kv_ratio=ratio)
        for t in turns:
            run.progress(f"turn {t['turn']}: TTFT p50 {fmt.ms(t['ttft_p50_ms'])}, prompt {t['prompt_tokens']:.0f} "
                         f"tokens, cached {fmt.pct(t['cached_share']) if t['cached_share'] is not None else 'n/a'}")
        return Measured(figures, records)

    def matrix_fields(self, cell: dict[str, Any], result: dict[str, Any],
                      provenance: dict[str, Any]) -> dict[str, Any]:
        turns = result.get("session_turns")
        return {"session_turns": json.dumps(turns) if turns else None,
                **{k: result.get(k) for k in self.column_names() if k != "session_turns"}}

    def cell_label(self, row: Any) -> str:
        return f"{int(row.concurrency)} users / {fmt.ctx(int(row.context_tokens))}"

    def report_table(self, m) -> Table:
        t = Table(["Context", "Users", "Turn", "Prompt tokens", "TTFT p50", "TTFT p95", "Cached (server)",
                   "Sessions completed", "Sessions within target", "History/KV"])
        for r in m.sort_values(["context_tokens", "concurrency"]).itertuples():
            if r.status == Status.OVER_CAPACITY or not isinstance(r.session_turns, str):
                continue
            for s in json.loads(r.session_turns):
                first = s["turn"] == 1
                t.add(fmt.ctx(int(r.context_tokens)), int(r.concurrency), s["turn"], f"{s['prompt_tokens']:.0f}",
                      fmt.ms(s["ttft_p50_ms"]), fmt.ms(s["ttft_p95_ms"]),
                      fmt.pct(s["cached_share"]) if s["cached_share"] is not None else "—",
                      fmt.integer(r.sessions_completed) if first else "",
                      fmt.pct(r.sessions_met_share) if first else "",
                      fmt.num(r.history_kv_ratio) if first else "")
        return t
