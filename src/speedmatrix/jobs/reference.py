"""Agreement with independent clients: one cell measured by speedmatrix and by other benchmark clients.

The ``reference`` rule takes cells of the experiment (capacity cells: N
requests at concurrency c, output capped) and, on the same running server,
measures each shape with speedmatrix's client and with every client named
under ``reference.clients`` (``speedmatrix.peers``: `vllm bench serve`,
AIPerf, GuideLLM), in rotating order, ``rounds`` times each: round k starts
with the k-th client, so no client always runs first on a cold server or last
on a warm one. Every client is asked for the same load (prompt and output
lengths, EOS ignored, greedy, streamed, /v1/completions) with a new seed each
round, so no round finds the previous round's prompts in the prefix cache. The
JSON holds every round, each client's medians and spread (min-max of its
rounds), the difference of each client's medians from speedmatrix's, the CPU
seconds and wall time of each client's process, and what each client's
figures mean where they differ from ours.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import peers
from ..core import atomic
from ..core.errors import ConfigError
from ..core.settings import ClientSettings
from ..measure import clientcheck
from ..measure.client import api_key
from . import cells
from .job import JobContext

OUR_NOTES = ("prompts cut from a text corpus and checked to the exact token count with the server's /tokenize; "
             "greedy; output tokens from the server's usage; TPOT per request, ITL every gap between streamed events")


def settings_of(exp) -> dict[str, Any]:
    return exp.raw.get("reference") or {}


def clients_of(settings: dict[str, Any]) -> list[str]:
    return list(settings["clients"])  # the experiment's, its schema default filled at load


def problems(exp) -> list[str]:
    """Before any server starts: every named client is known and importable, and can send a rate cell's
    open-loop arrivals where the reference names one."""
    settings = settings_of(exp)
    if not settings:
        return []
    out = peers.problems(clients_of(settings), settings, str(exp.path))
    table = peers.table()
    cells_by_id = {c.id: c for c in exp.cells()}
    open_loop = [cells_by_id[cid] for cid in settings.get("cells", [])
                 if cid in cells_by_id and "rate" in cells_by_id[cid].kind.reference_load(cells_by_id[cid])]
    unable = [c.id for c in open_loop
              if not any(n in table and table[n].can_send(c.kind.reference_load(c)) for n in clients_of(settings))]
    if unable:
        out.append(f"{exp.path}: key 'reference.clients': none of {', '.join(clients_of(settings))} can send "
                   f"these cells' open-loop arrivals at a rate (reference.cells names {', '.join(unable)}): add one "
                   "that can (vllm_bench_serve)")
    return out


def clients_for(cell: cells.Cell, names: list[str]) -> tuple[list[str], list[str]]:
    """The named clients that can measure the cell, and those left out: a client without open-loop arrivals at a
    rate measures no rate cell (the others' cells it measures as ever)."""
    table, load = peers.table(), cell.kind.reference_load(cell)
    return [n for n in names if table[n].can_send(load)], [n for n in names if not table[n].can_send(load)]


# what speedmatrix's own round keeps beside the compared figures: whether its client kept up (the client check and,
# in an open loop, how late requests left against their schedule) and what failed, by kind
CHECK = ("status", "status_reason", "errors_by_kind", "schedule_lag_p95_ms", *clientcheck.FIGURES)


def _ours(result: dict[str, Any]) -> dict[str, Any]:
    return {**{k: result.get(k) for k in peers.FIELDS},
            "check": {k: result[k] for k in CHECK if result.get(k) is not None}}


def short_round(row: dict[str, Any], asked: int | None) -> str | None:
    """Why a round that ran to its end is still not compared: it completed fewer requests than asked (a client
    that stopped early measured another load: its tok/s and latencies are not the cell's). None when whole."""
    done = row.get("completed")
    if row.get("error") or done is None or asked is None or done >= asked:
        return None
    return f"completed {done:g} of the {asked} requests asked: kept in the document, left out of the agreement"


def compare(cell: cells.Cell, url: str, model: str, tokenizer: str, client_cfg: ClientSettings, names: list[str],
            settings: dict[str, Any], rounds: int, api_key: str | None = None, loop_cfg: dict[str, Any] | None = None,
            server_env: dict[str, str] | None = None, kv_tokens: int | None = None,
            progress=print) -> dict[str, list[dict[str, Any]]]:
    """Each client's rounds on a running server: speedmatrix in this process, the others in their own."""
    table = peers.table()
    if Path(tokenizer).exists():  # the clients run in their own folders: a local path must not be relative
        tokenizer = str(Path(tokenizer).resolve())
    order = [peers.OURS, *names]
    runs: dict[str, list[dict[str, Any]]] = {who: [] for who in order}
    asked = cell.kind.reference_load(cell)  # what every client is asked, the same each round
    for k in range(rounds):
        for who in order[k % len(order):] + order[:k % len(order)]:
            seed = int(time.time() * 1000) % 2**31
            if who == peers.OURS:
                cpu0, t0 = time.process_time(), time.perf_counter()
                inp = cells.MeasureInput(url, model, client_cfg, loop_cfg, None, server_env, kv_tokens,
                                         progress=progress)
                result, _ = asyncio.run(cells.measure(cell, inp))
                row = {**_ours(result), "process_wall_s": round(time.perf_counter() - t0, 3),
                       "client_cpu_s": round(time.process_time() - cpu0, 3)}
            else:
                load = peers.Load(**{"concurrency": 0, **asked}, url=url, model=model,
                                  tokenizer=tokenizer, context=cell.context_tokens, max_tokens=cell.max_tokens,
                                  seed=seed, sampling=cell.sampling_params)
                with tempfile.TemporaryDirectory(prefix=f"{who}-") as tmp:
                    try:
                        row = peers.run(table[who], load, peers.python_for(who, settings), Path(tmp), api_key)
                    except RuntimeError as exc:  # one client failing costs its own rounds, not the others'
                        row = {"error": str(exc)[-1500:], "client_cpu_s": None, "process_wall_s": None}
            short = short_round(row, asked.get("requests"))
            if short:
                row["error"] = short
            row["round"] = k
            runs[who].append(row)
            progress(f"round {k + 1}/{rounds} {who} failed: {row['error'][-300:]}" if "error" in row else
                     f"round {k + 1}/{rounds} {who}: tok/s {row.get('output_throughput')}, median TTFT "
                     f"{row.get('median_ttft_ms')} ms, median TPOT {row.get('median_tpot_ms')} ms, "
                     f"client CPU {row['client_cpu_s']} s over {row['process_wall_s']} s")
    return runs


def document(cell: cells.Cell, runs: dict[str, list[dict[str, Any]]], **extra: Any) -> dict[str, Any]:
    """The agreement's JSON (the rule's and `speedmatrix agree`'s): every round, the summary, what each
    client's figures mean, and the clients that failed (a reported fact, like a failed cell: the other
    clients' rounds and the report stand)."""
    table = peers.table()
    notes = {who: OUR_NOTES if who == peers.OURS else table[who].notes for who in runs}
    failed = {who: r["error"] for who, rs in runs.items() for r in rs if r.get("error")}
    return {**extra, "cell": cell.as_dict(), "clients": list(runs), "runs": runs, **peers.summarize(runs),
            "notes": notes, "failed": failed}


def run_rule(job: JobContext, cell_id: str, out_json: str) -> dict[str, Any]:
    """The reference rule: one cell measured by speedmatrix and by each named client, in rotating order, on the
    same server."""
    exp, launch = job.experiment, job.launch
    # one measurement a round, as every other client makes: the rounds are the repeats (a GPU profile's
    # `repeats: 3` would have speedmatrix send three times the requests of the others each round)
    cell = dataclasses.replace(exp.cell(job.server_id, cell_id), repeats=1)
    cell = cell.kind.for_reference(cell)
    if not cell.kind.reference:
        raise ConfigError(f"{exp.path}: key 'reference.cells': {cell_id} is a {cell.workload} cell; the "
                          "comparison with other clients takes cells of N requests at c, output capped")
    settings = settings_of(exp)
    rounds = int(settings["rounds"])
    # known and importable (preflight checked them before any job); those that cannot send at a rate sit a rate
    # cell out, said in its document
    names, left_out = clients_for(cell, clients_of(settings))
    job.use_api_key()
    client_cfg = exp.client.replace(ignore_eos=True)  # every client ignores EOS: the same output lengths
    tokenizer = settings.get("tokenizer", launch["model_dir"])
    with job.server() as info:
        runs = compare(cell, info["url"], launch["served_model_name"], tokenizer, client_cfg, names, settings,
                       rounds, api_key(), exp.loops, launch.get("server_env"),
                       info["startup"].get("kv_cache_size_tokens"))
        startup = info["startup"]
    doc = document(cell, runs, experiment=exp.name, server_id=job.server_id, rounds=rounds, client=client_cfg.as_dict(),
                   provenance=job.provenance(startup),
                   left_out={n: "cannot send these open-loop arrivals (a rate, of this gamma shape)" for n in left_out})
    atomic.write_json(out_json, doc)
    if doc["failed"]:
        print(f"failed rounds (kept with their errors in {out_json}): {', '.join(sorted(doc['failed']))}")
    print(f"agreement ({rounds} rounds each, medians, client against speedmatrix): {doc['difference_pct']}")
    return doc
