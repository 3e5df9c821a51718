"""One benchmark cell: decide capacity from the live server, measure, write the result once.

A cell writes ``<cell_id>.json`` (figures, server counter deltas, provenance)
and ``<cell_id>.requests.parquet`` (one row per request, generated text
included) atomically, and only when the measurement is good. Anything that
makes the measurement meaningless (the server died, every request failed)
raises :class:`CellError`: the job fails alone, writes nothing, and the next
run measures that cell again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pandas as pd

from . import atomic, client, loops, metrics, prompts, stats, telemetry
from .errors import CellError
from .job import JobContext
from .workloads import Cell, CellRun

MAX_FAILED_FRACTION = 0.5
# idle keep-alive connections of the cell's own session (prompts, counters) are dropped after this long:
# below the server's keep-alive (vLLM: VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s), or a call after a window reuses
# a connection the server is closing ("Can not write request body", seen after a 4 s decode window)
SESSION_KEEPALIVE_S = 1.0


def needed_kv_tokens(cell: Cell) -> int:
    """KV tokens the cell needs at once (its kind decides: every request at full context plus its cap)."""
    return cell.kind.needed_kv_tokens(cell)


async def _scrape(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """The server's Prometheus samples; {} when it has no /metrics (then every counter field is absent)."""
    try:
        async with session.get(f"{url}/metrics", headers=client.auth_headers()) as resp:
            if resp.status != 200:
                return {}
            return metrics.parse(await resp.text())
    except (aiohttp.ClientError, ValueError):
        return {}


def _in_flight(samples: dict[str, Any]) -> tuple[float, float] | None:
    running = metrics.total(samples, metrics.GAUGES["running"])
    waiting = metrics.total(samples, metrics.GAUGES["waiting"])
    return None if running is None or waiting is None else (running, waiting)


async def wait_until_idle(session: aiohttp.ClientSession, url: str, wait_s: float,
                          progress: Callable[[str], None]) -> dict[str, Any]:
    """The server's samples once it has no request running or waiting; CellError if it stays busy.

    A benchmark needs the server to itself: requests that are not the cell's
    would be measured as if they were. Without the gauges (a server with no
    vLLM metrics) this cannot be known and the cell runs.
    """
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        samples = await _scrape(session, url)
        busy = _in_flight(samples)
        if busy is None or sum(busy) == 0:
            return samples
        if time.monotonic() >= deadline:
            raise CellError(
                f"the server at {url} is busy with requests that are not this cell's ({busy[0]:g} running, "
                f"{busy[1]:g} waiting, still after {wait_s:g} s): a measurement needs the server to itself. Stop "
                "the other client or point the cell at a server of its own, then run again.")
        if not said:
            progress(f"server busy ({busy[0]:g} running, {busy[1]:g} waiting); waiting up to {wait_s:g} s")
            said = True
        await asyncio.sleep(0.5)


class GaugeSampler:
    """Samples the server's running and waiting gauges during a measurement (one scrape per interval).

    Off unless ``metrics_interval_s`` > 0: a scrape makes vLLM's API server render all its metrics
    (about 50 KB, 40 ms on the CPU default), and one a second cost the CPU default about 20 % of its
    throughput (docs/decisions/0002-measurement.md). A foreign request is found without it, from the
    server's finished-request counter."""

    def __init__(self, url: str, interval_s: float) -> None:
        self.url, self.interval_s = url, interval_s
        self.samples: list[tuple[float, float]] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            while True:
                got = _in_flight(await _scrape(session, self.url))
                if got is None:
                    return  # no gauges: nothing to sample
                self.samples.append(got)
                await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        if self.interval_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> dict[str, Any]:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        s = self.samples
        return {
            "server_gauge_samples": len(s),
            "server_running_mean": sum(r for r, _ in s) / len(s) if s else None,
            "server_running_max": max(r for r, _ in s) if s else None,
            "server_waiting_max": max(w for _, w in s) if s else None,
        }


async def _counters(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        return await _scrape(session, url)


def request_options(cell: Cell, client_cfg: dict[str, Any], loop_cfg: dict[str, Any] | None = None,
                    eos_text: str | None = None) -> client.RequestOptions:
    """The cell's request options. ``usage_per_chunk`` ``auto`` (the default) asks for per-event
    token counts only where they are needed to be exact: a decode cell cuts its requests at the
    window's end, before their final usage event. The other cells run every request to its end,
    and the final usage event gives its exact total at no cost to the server."""
    per_chunk = client_cfg.get("usage_per_chunk", "auto")
    if per_chunk == "auto":
        per_chunk = cell.kind.cut_at_window_end
    return client.RequestOptions(
        max_tokens=cell.kind.request_max_tokens(cell),
        stall_timeout_s=float(client_cfg.get("stall_timeout_s", 60.0)),
        ignore_eos=bool(client_cfg.get("ignore_eos", False)),
        usage_per_chunk=bool(per_chunk),
        stop_looping=bool(client_cfg.get("stop_looping", False)),
        loop_thresholds={k: v for k, v in (loop_cfg or {}).items() if k in loops.DEFAULTS},
        eos_text=eos_text,
        api=client_cfg.get("api", "completions"),
        chat_template_kwargs=client_cfg.get("chat_template_kwargs"),
    )


async def measure(
    cell: Cell,
    url: str,
    model: str,
    client_cfg: dict[str, Any],
    progress: Callable[[str], None] = print,
    loop_cfg: dict[str, Any] | None = None,
    eos_text: str | None = None,
    gpu_env: dict[str, str] | None = None,
    kv_tokens_fallback: int | None = None,
    tokenizer_dir: str | None = None,
) -> tuple[dict[str, Any], list[client.RequestRecord]]:
    """Measure one cell against a running server: (result, per-request records).

    Where NVML answers, the server's GPUs (``gpu_env``'s CUDA_VISIBLE_DEVICES,
    else all) are sampled while the cell's requests run (speedmatrix.telemetry).

    Server counters are scraped before and after (and between the passes of a
    prefix-cache cell); against a server without vLLM's metrics every counter
    field is recorded as absent (None) and the cell still runs.
    """
    seed = int(client_cfg.get("seed", 0))
    opts = request_options(cell, client_cfg, loop_cfg, eos_text)
    ignore_eos = opts.ignore_eos
    busy_wait_s = float(client_cfg.get("busy_wait_s", 30.0))
    prompt_format = client_cfg.get("prompt_format", "text")
    nonce = secrets.token_hex(4)
    # this session stays open through the measurement: it builds text prompts a decode cell needs late
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60),
                                     connector=aiohttp.TCPConnector(keepalive_timeout=SESSION_KEEPALIVE_S)) as session:
        before_raw = await _scrape(session, url)
        kv = metrics.cache_info(before_raw)["kv_cache_size_tokens"] or kv_tokens_fallback
        need = needed_kv_tokens(cell)
        base: dict[str, Any] = {
            "kv_cache_size_tokens": kv,
            "needed_kv_tokens": need,
            "server_metrics": "present" if before_raw else "absent",
            "ignore_eos": ignore_eos,
            "usage_per_chunk": opts.usage_per_chunk,
            "stop_looping": opts.stop_looping,
            "prompt_format": prompt_format,
            "api": opts.api,
            "chat_template_kwargs": opts.chat_template_kwargs,
            "prompt_seed": seed,
            "prompt_nonce": nonce,
        }
        if kv is not None and need > kv:
            progress(f"over capacity: needs {need} KV tokens, the server has {kv}; not sent")
            return {**base, "status": "over_capacity"}, []
        before_raw = await wait_until_idle(session, url, busy_wait_s, progress)
        source = await prompts.from_server(session, url, model, seed=seed, kind=cell.corpus, nonce=nonce,
                                           headers=client.auth_headers())
        aligner = (prompts.TextAligner(session, url, model, client.auth_headers())
                   if prompt_format == "text" else None)

        async def build(id_lists: list[list[int]]) -> list:
            """The prompts as sent: text checked by the server's tokenizer, or the ids themselves."""
            return await aligner.many(id_lists, source.corpus_ids[:256]) if aligner else id_lists

        # prompts wanted while a window measures are made with the model's tokenizer on this machine,
        # never with calls to the server being measured (checked against the server's count first)
        local = prompts.local_aligner(tokenizer_dir) if aligner else None
        if local is not None:
            sample = await local.many([source.prompt(i, cell.context_tokens, "check") for i in range(2)],
                                      source.corpus_ids[:256])
            if not await local.agrees_with(aligner, sample):
                progress("the local tokenizer counts prompts differently from the server's: decode prompts are "
                         "built ahead by the server only")
                local = None
        in_window = {"server_calls": 0}

        async def build_in_window(id_lists: list[list[int]]) -> list:
            """Prompts wanted while a window measures: local where the tokenizer is here, else the server's
            (counted: the cell says how many it had to make that way)."""
            if local is not None:
                return await local.many(id_lists, source.corpus_ids[:256])
            if aligner is not None:
                in_window["server_calls"] += len(id_lists)
            return await build(id_lists)

        sampler = GaugeSampler(url, float(client_cfg.get("metrics_interval_s", 0)))
        gpu = telemetry.Sampler(env=gpu_env)  # no NVML (the CPU default): samples nothing, returns None
        gpu.start()
        try:
            per_repeat, per_passes, records = [], [], []
            t_wall = None
            for k in range(1, cell.repeats + 1):
                if k > 1:  # the previous repeat's requests have drained (a cut decode request is aborted)
                    await wait_until_idle(session, url, busy_wait_s, progress)
                    progress(f"repeat {k} of {cell.repeats}")
                run = CellRun(cell, url, model, opts, source, build, before_raw, client_cfg, progress,
                              scrape=lambda: _counters(url), repeat=k, build_in_window=build_in_window,
                              kv_tokens=kv)
                prepared = await cell.kind.prepare(run)  # prompts are built before the clock starts
                if t_wall is None:
                    t_wall = time.time()
                    sampler.start()
                measured = await cell.kind.measure(run, prepared)
                for r in measured.records:  # request indices stay unique over the cell's repeats
                    r.index += len(records)
                    r.repeat = k
                records += measured.records
                per_repeat.append(measured.figures)
                if measured.passes:
                    per_passes.append(measured.passes)
            figures = stats.combine(per_repeat)
            passes = {ph: stats.combine([p[ph] for p in per_passes]) for ph in per_passes[0]} if per_passes else {}
            if cell.repeats > 1:
                figures["repeat_figures"] = per_repeat  # each repeat's own figures, in order
        except BaseException:
            gpu.stop()
            raise
        gpu_summary = gpu.stop(figures.get("total_output_tokens"))
    gauges = await sampler.stop()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        # every request of the cell has ended on the client; the server must drain too (a request cut
        # at a decode window's end is aborted within moments); still busy means someone else's requests
        after_raw = await wait_until_idle(session, url, busy_wait_s, progress)
    counters = metrics.delta(metrics.snapshot(before_raw), metrics.snapshot(after_raw))
    received = sum(r.output_tokens for r in records)
    gen = counters.get("server_generation_tokens")
    gap = None if gen is None else gen - received
    base["prompt_builder"] = ("local tokenizer" if local is not None else
                              "server" if aligner is not None else "token ids")
    base["prompts_built_by_server_in_window"] = in_window["server_calls"]
    if in_window["server_calls"]:
        progress(f"{in_window['server_calls']} prompts were made by the server while a window measured (no "
                 "local tokenizer): the server did that work on top of the cell's")
    if aligner and aligner.fallbacks:
        progress(f"{aligner.fallbacks} prompt(s) could not be made exact as text and were sent as token ids")
    base["prompts_sent_as_token_ids"] = sum(1 for r in records if r.prompt_format == "token_ids")
    base["loops_seen_online"] = sum(1 for r in records if r.loop_detected_at_token is not None)
    base["requests_stopped_for_loop"] = sum(1 for r in records if r.stopped_for_loop)
    finished = counters.get("server_requests_finished")  # the whole cell's, both passes of a prefix-cache cell
    if passes:  # a prefix-cache cell's headline figures are its warm pass's
        counters.update({k: passes["warm"][k] for k in metrics.DELTA_KEYS})
    n = len(records)
    failed = sum(1 for r in records if r.error)
    if n == 0:
        raise CellError("no request was sent")
    if failed == n or failed / n > MAX_FAILED_FRACTION:
        kinds = sorted({r.error for r in records if r.error})[:3]
        raise CellError(f"{failed} of {n} requests failed: {'; '.join(kinds)}")
    peak = gauges["server_running_max"]
    if ((peak is not None and peak + (gauges["server_waiting_max"] or 0) > cell.concurrency)
            or (finished is not None and finished > n)):
        raise CellError(
            f"the server at {url} served requests that were not this cell's during it (it finished "
            f"{finished if finished is None else int(finished)} requests, the cell sent {n}; most running at once "
            f"{peak if peak is None else int(peak)}, the cell's concurrency {cell.concurrency}): the figures "
            "are not this cell's. Give the benchmark the server to itself and run again.")
    result = {
        **base,
        "status": "valid",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t_wall)),
        "server_running_before": (_in_flight(before_raw) or (None,))[0],
        **figures,
        **counters,
        **gauges,
        # every token the client received (a decode cell's window counts fewer), and what the server
        # counted: equal for cells whose requests all run to their end
        "client_output_tokens": received,
        "token_count_gap": gap,
    }
    if gpu_summary:
        per_gpu = gpu_summary.pop("per_gpu")
        result.update(gpu_summary)
        result["gpu_per_gpu"] = per_gpu
    if passes:
        result["passes"] = passes
    return result, records


def request_table(records: list[client.RequestRecord], ident: dict[str, Any]) -> pd.DataFrame:
    rows = []
    for r in records:
        rows.append({
            **ident,
            "request_index": r.index,
            "worker": r.worker,
            "prompt_tokens": r.prompt_tokens,
            "start_s": r.start,
            "ttft_ms": (r.first_token - r.start) * 1000 if r.first_token is not None else None,
            "end_s": r.end,
            "output_tokens": r.output_tokens,
            "chunks": len(r.chunk_times),
            "finish_reason": r.finish_reason,
            "cut_at_window_end": r.cut_at_window_end,
            "error": r.error,
            "tokens_reconciled": r.tokens_reconciled,
            "prompt_format": r.prompt_format,
            "server_prompt_tokens": r.server_prompt_tokens,
            "loop_detected_at_token": r.loop_detected_at_token,
            "natural_end_char": r.natural_end_char,
            "stopped_for_loop": r.stopped_for_loop,
            # per streamed event: tokens and characters (a loop's onset in tokens comes from them)
            "chunk_tokens": r.chunk_tokens,
            "chunk_chars": r.chunk_chars,
            "phase": r.phase,
            "repeat": r.repeat,
            "text": r.text,
        })
    cols = ["request_index", "worker", "prompt_tokens", "start_s", "ttft_ms", "end_s", "output_tokens", "chunks",
            "finish_reason", "cut_at_window_end", "error", "tokens_reconciled", "prompt_format", "server_prompt_tokens",
            "loop_detected_at_token",
            "natural_end_char",
            "stopped_for_loop", "chunk_tokens", "chunk_chars", "phase", "repeat", "text"]
    return pd.DataFrame(rows, columns=list(ident) + cols)


def write(cell_json: str, requests_parquet: str, result: dict[str, Any], records: list[client.RequestRecord],
          ident: dict[str, Any]) -> None:
    """Write the per-request table first, the cell JSON last: the JSON marks a finished cell."""
    table = request_table(records, ident)
    tmp = f"{requests_parquet}.tmp-{os.getpid()}"
    table.to_parquet(tmp, index=False)
    os.replace(tmp, requests_parquet)
    atomic.write_json(cell_json, result)


def measurement_key(cell: Cell, launch: dict[str, Any], lock: dict[str, Any], client_cfg: dict[str, Any],
                    loop_cfg: dict[str, Any] | None = None) -> str:
    """What a measurement depends on: the cell, the exact server launch, the runtime, the client settings."""
    basis = {
        "cell": cell.as_dict(),
        "argv": launch["argv"],
        "env": launch["env"],
        "models": launch["models"],
        "packages_sha256": lock.get("packages_sha256"),
        "runtime_ref": lock.get("runtime_ref"),  # a container image's digest
        "client": client_cfg,
        # with stop_looping the loop thresholds decide when a request ends: part of the measurement
        "loops": loop_cfg if client_cfg.get("stop_looping") else None,
    }
    return hashlib.sha256(json.dumps(basis, sort_keys=True, default=str).encode()).hexdigest()[:20]


def store_paths(results_dir: Path, server_id: str, cell_id: str, key: str) -> tuple[Path, Path]:
    base = results_dir / "store" / server_id / cell_id
    return base / f"{key}.json", base / f"{key}.requests.parquet"


def restore(stored_json: Path, stored_requests: Path, out_json: str, out_requests: str) -> bool:
    """Copy a durable result into the cell's outputs (byte for byte); False if there is none."""
    if not (stored_json.exists() and stored_requests.exists()):
        return False
    atomic.write_bytes(out_requests, stored_requests.read_bytes())
    atomic.write_bytes(out_json, stored_json.read_bytes())
    return True


def gpu_env(launch: dict[str, Any], info: dict[str, Any]) -> dict[str, str]:
    """The server's GPUs for the telemetry: those it holds from the pool, else its config's environment."""
    env = dict(launch.get("server_env") or {})
    if info.get("gpus"):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(info["gpus"])
    return env


def run(job: JobContext, cell_id: str, out_json: str, out_requests: str) -> dict:
    """The cell rule: acquire the server (starting it if needed), measure, write once.

    A good measurement is first written to the experiment's durable store
    (``<results>/<experiment>/store/``, keyed by everything it depends on) and
    then to the cell's outputs. If Snakemake removes the outputs of a cell
    that had finished (it does so for every member of a failed group job on a
    cluster), the next run restores them from the store instead of measuring
    again, without starting a server.
    """
    exp, launch, server_id = job.experiment, job.launch, job.server_id
    cell = exp.cell(server_id, cell_id)
    progress = print
    progress(f"cell {server_id}/{cell_id}: {cell.as_dict()}")
    job.use_api_key()
    key = measurement_key(cell, launch, job.lock, exp.client, exp.loops)
    stored_json, stored_requests = store_paths(job.results, server_id, cell_id, key)
    if restore(stored_json, stored_requests, out_json, out_requests):
        doc = atomic.read_json(out_json)
        progress(f"restored from the durable store {stored_json} (measured "
                 f"{doc['result'].get('started_at', 'earlier')}); not measured again")
        return doc
    with job.server(progress) as info:
        startup = info["startup"]
        progress(f"server {server_id} start {startup['start_id']} at {info['url']} "
                 f"(KV cache {startup.get('kv_cache_size_tokens')} tokens)")
        result, records = asyncio.run(measure(cell, info["url"], launch["served_model_name"], exp.client, progress,
                                              exp.loops, launch.get("eos_text"), gpu_env(launch, info),
                                              startup.get("kv_cache_size_tokens"), launch.get("model_dir")))
        if result.get("failed"):
            # requests failed: keep the cell only if its server is still the same healthy server
            # (a killed server closes its sockets while it is still exiting, so look twice)
            time.sleep(1.0)
            if not job.server_healthy(info):
                raise CellError(f"the server of {server_id} died during the cell; {result['failed']} requests "
                                f"failed ({result['errors_by_kind']}); see {job.server_dir}/server.log")
    # the other cells that measured while this one did (a GPU pool runs configs side by side)
    result["beside"] = info.get("beside") or []
    doc = {
        "experiment": exp.name,
        "cell": cell.as_dict(),
        "server": {"server_id": server_id, "model": launch["model"], "spec_tokens": launch["spec_tokens"],
                   "served_model_name": launch["served_model_name"], "sweep": launch.get("sweep"),
                   "sweep_values": launch.get("sweep_values") or {}},
        "client": exp.client,
        "result": result,
        "provenance": job.provenance(startup),
    }
    doc["measurement_key"] = key
    ident = {"experiment": exp.name, "server_id": server_id, "cell_id": cell_id}
    stored_json.parent.mkdir(parents=True, exist_ok=True)
    write(str(stored_json), str(stored_requests), doc, records, ident)
    restore(stored_json, stored_requests, out_json, out_requests)
    progress(f"done: status {result['status']}, output_throughput {result.get('output_throughput')}")
    return doc
