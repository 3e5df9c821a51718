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
import socket
import time
from pathlib import Path
from typing import Any, Callable

import aiohttp
import pandas as pd

from . import __version__, atomic, client, loops, metrics, prompts, stats, telemetry
from .experiment import Cell

MAX_FAILED_FRACTION = 0.5


class CellError(RuntimeError):
    pass


def needed_kv_tokens(cell: Cell) -> int:
    """KV tokens the cell needs at once: every request at full context plus its output cap."""
    return cell.concurrency * (cell.context_tokens + cell.max_tokens)


def scheduler_env() -> dict[str, str]:
    keys = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_NODELIST", "SLURM_STEP_ID")
    return {k: os.environ[k] for k in keys if k in os.environ}


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
        per_chunk = cell.workload == "decode"
    return client.RequestOptions(
        max_tokens=1 if cell.workload == "prefill" else cell.max_tokens,
        stall_timeout_s=float(client_cfg.get("stall_timeout_s", 60.0)),
        ignore_eos=bool(client_cfg.get("ignore_eos", False)),
        usage_per_chunk=bool(per_chunk),
        stop_looping=bool(client_cfg.get("stop_looping", False)),
        loop_thresholds={k: v for k, v in (loop_cfg or {}).items() if k in loops.DEFAULTS},
        eos_text=eos_text,
        api=client_cfg.get("api", "completions"),
        chat_template_kwargs=client_cfg.get("chat_template_kwargs"),
    )


async def _run_workload(cell: Cell, url: str, model: str, opts: client.RequestOptions,
                        source: prompts.PromptSource, build: Callable, sampler: "GaugeSampler",
                        before_raw: dict[str, Any], client_cfg: dict[str, Any],
                        progress: Callable[[str], None]) -> tuple[dict, list, dict, float]:
    """Send the cell's requests: (figures, records, passes of a prefix-cache cell, wall-clock start)."""
    salt = f"{cell.server_id}/{cell.id}"
    ctx = cell.context_tokens
    passes: dict[str, dict[str, Any]] = {}
    if cell.workload == "decode":
        # Prompts are built ahead: a first batch before the window, then a producer keeps at least
        # `concurrency` spare ones ready, so a finished request is replaced at once (building one as
        # text takes two calls to the server; a worker that waited for them would leave a slot idle).
        queued: asyncio.Queue = asyncio.Queue()
        built = 4 * cell.concurrency + 16
        for p in await build([source.prompt(i, ctx, salt) for i in range(built)]):
            queued.put_nowait(p)

        async def producer() -> None:
            nonlocal built
            while True:
                if queued.qsize() < 2 * cell.concurrency + 8:
                    batch = max(8, cell.concurrency)
                    for p in await build([source.prompt(i, ctx, salt) for i in range(built, built + batch)]):
                        queued.put_nowait(p)
                    built += batch
                else:
                    await asyncio.sleep(0.05)

        async def make(i: int):
            return await queued.get()
    elif cell.workload == "prefix_cache":
        shared = round(cell.shared_prefix * ctx)
        by_phase = {phase: await build([source.shared_prefix_prompt(i, ctx, shared, salt)
                                     for i in range(k * cell.requests, (k + 1) * cell.requests)])
                 for k, phase in enumerate(("cold", "warm"))}
    else:
        ready_list = await build([source.prompt(i, ctx, salt) for i in range(cell.requests)])
    t_wall = time.time()
    sampler.start()
    if cell.workload == "decode":
        progress(f"decode: {cell.concurrency} at once for {cell.duration_s:g} s, context {ctx}")
        filling = asyncio.create_task(producer())
        try:
            _, records = await asyncio.wait_for(
                client.closed_loop(url, model, make, cell.concurrency, cell.duration_s, opts, progress),
                timeout=float(client_cfg.get("cell_timeout_s", cell.duration_s + opts.stall_timeout_s + 120)),
            )
        finally:
            filling.cancel()
        figures = stats.decode(records, cell.duration_s)
        figures["prompts_built"] = built
    elif cell.workload == "prefill":
        progress(f"prefill: {cell.requests} single requests at context {ctx}")
        records = await client.sequential(url, model, ready_list, opts)
        figures = stats.prefill(records, ctx)
    elif cell.workload == "latency":
        progress(f"latency: {cell.requests} requests one at a time, context {ctx}")
        t0 = time.monotonic()
        records = await client.sequential(url, model, ready_list, opts)
        figures = stats.fixed(records, time.monotonic() - t0)
    elif cell.workload == "capacity":
        progress(f"capacity: {cell.requests} requests, {cell.concurrency} at once, context {ctx}, "
                 f"cap {cell.max_tokens} tokens")
        wall, records = await client.fixed_count(url, model, lambda i: ready_list[i], cell.requests,
                                                 cell.concurrency, opts)
        figures = stats.fixed(records, wall)
    elif cell.workload == "prefix_cache":
        records = []
        snap = metrics.snapshot(before_raw)
        for k, phase in enumerate(("cold", "warm")):
            progress(f"prefix cache, {phase} pass: {cell.requests} requests, {cell.concurrency} at once, "
                     f"{shared} of {ctx} tokens shared")
            first = k * cell.requests
            wall, recs = await client.fixed_count(url, model, lambda i, ps=by_phase[phase], f=first: ps[i - f],
                                                  cell.requests, cell.concurrency, opts, phase=phase,
                                                  first_index=first)
            after = metrics.snapshot(await _counters(url))
            passes[phase] = {**stats.fixed(recs, wall), **metrics.delta(snap, after),
                             "client_output_tokens": sum(r.output_tokens for r in recs)}
            snap = after
            records += recs
        figures = {k: v for k, v in passes["warm"].items() if k not in metrics.DELTA_KEYS}
        figures["shared_prefix_tokens"] = shared
    else:
        raise CellError(f"unknown workload {cell.workload!r}")
    return figures, records, passes, t_wall


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
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
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

        sampler = GaugeSampler(url, float(client_cfg.get("metrics_interval_s", 0)))
        gpu = telemetry.Sampler(env=gpu_env)  # no NVML (the CPU default): samples nothing, returns None
        gpu.start()
        try:
            figures, records, passes, t_wall = await _run_workload(cell, url, model, opts, source, build, sampler,
                                                                   before_raw, client_cfg, progress)
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
            "text": r.text,
        })
    cols = ["request_index", "worker", "prompt_tokens", "start_s", "ttft_ms", "end_s", "output_tokens", "chunks",
            "finish_reason", "cut_at_window_end", "error", "tokens_reconciled", "prompt_format", "server_prompt_tokens",
            "loop_detected_at_token",
            "natural_end_char",
            "stopped_for_loop", "chunk_tokens", "chunk_chars", "phase", "text"]
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


def provenance(startup: dict[str, Any], runtime_lock: dict[str, Any], launch: dict[str, Any]) -> dict[str, Any]:
    return {
        "speedmatrix_version": __version__,
        "hostname": socket.gethostname(),
        "server_start_id": startup.get("start_id"),
        "server_started_at": startup.get("started_at"),
        "vllm_version": startup.get("vllm_version"),
        "runtime_ref": runtime_lock.get("runtime_ref"),
        "packages_sha256": runtime_lock.get("packages_sha256"),
        "launch_argv": startup.get("argv"),
        # GiB of weights on each GPU, from the server's log (the decode roofline's numerator)
        "model_weights_gib": startup.get("model_weights_gib"),
        "models": launch.get("models"),
        "scheduler": scheduler_env(),
    }


def use_api_key(launch: dict[str, Any]) -> None:
    """The server's key (config: api_key_env) is what the client sends; it stays in this process's
    environment and the server's, never in a file."""
    name = launch.get("api_key_env")
    if not name:
        return
    if not os.environ.get(name):
        raise CellError(f"server config {launch['server_id']} takes its API key from the environment variable "
                        f"{name}, which is not set: export {name}=... and run again")
    os.environ[client.API_KEY_ENV] = os.environ[name]


def run(experiment_name: str, experiments_dir: str, server_id: str, cell_id: str,
        launch_path: str, lock_path: str, out_json: str, out_requests: str, idle_timeout_s: float) -> dict:
    """The cell rule: acquire the server (starting it if needed), measure, write once.

    A good measurement is first written to the experiment's durable store
    (``<results>/<experiment>/store/``, keyed by everything it depends on) and
    then to the cell's outputs. If Snakemake removes the outputs of a cell
    that had finished (it does so for every member of a failed group job on a
    cluster), the next run restores them from the store instead of measuring
    again, without starting a server.
    """
    from . import experiment, server

    exp = experiment.load(experiment_name, experiments_dir)
    cell = exp.cell(server_id, cell_id)
    # <results_root>/<experiment>/servers/<server_id>/launch.json: the device lock
    # and the registry of running servers live at the results root
    results_root = Path(launch_path).resolve().parents[3]
    launch = atomic.read_json(launch_path)
    lock = atomic.read_json(lock_path)
    progress = print
    progress(f"cell {server_id}/{cell_id}: {cell.as_dict()}")
    use_api_key(launch)
    key = measurement_key(cell, launch, lock, exp.client, exp.loops)
    stored_json, stored_requests = store_paths(Path(launch_path).resolve().parents[2], server_id, cell_id, key)
    if restore(stored_json, stored_requests, out_json, out_requests):
        doc = atomic.read_json(out_json)
        progress(f"restored from the durable store {stored_json} (measured "
                 f"{doc['result'].get('started_at', 'earlier')}); not measured again")
        return doc
    with server.acquire(results_root, exp.name, server_id, launch, idle_timeout_s, progress) as info:
        startup = info["startup"]
        progress(f"server {server_id} start {startup['start_id']} at {info['url']} "
                 f"(KV cache {startup.get('kv_cache_size_tokens')} tokens)")
        result, records = asyncio.run(measure(cell, info["url"], launch["served_model_name"], exp.client, progress,
                                              exp.loops, launch.get("eos_text"), launch.get("server_env"),
                                              startup.get("kv_cache_size_tokens")))
        if result.get("failed"):
            # requests failed: keep the cell only if its server is still the same healthy server
            # (a killed server closes its sockets while it is still exiting, so look twice)
            time.sleep(1.0)
            if not server.healthy(info):
                raise CellError(f"the server of {server_id} died during the cell; {result['failed']} requests "
                                f"failed ({result['errors_by_kind']}); see {Path(launch_path).parent}/server.log")
    doc = {
        "experiment": exp.name,
        "cell": cell.as_dict(),
        "server": {"server_id": server_id, "model": launch["model"], "spec_tokens": launch["spec_tokens"],
                   "served_model_name": launch["served_model_name"], "sweep": launch.get("sweep"),
                   "sweep_values": launch.get("sweep_values") or {}},
        "client": exp.client,
        "result": result,
        "provenance": provenance(startup, lock, launch),
    }
    doc["measurement_key"] = key
    ident = {"experiment": exp.name, "server_id": server_id, "cell_id": cell_id}
    stored_json.parent.mkdir(parents=True, exist_ok=True)
    write(str(stored_json), str(stored_requests), doc, records, ident)
    restore(stored_json, stored_requests, out_json, out_requests)
    progress(f"done: status {result['status']}, output_throughput {result.get('output_throughput')}")
    return doc
