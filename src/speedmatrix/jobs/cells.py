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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pandas as pd

from ..core import atomic, runfolder
from ..core.errors import CellError
from ..core.settings import ClientSettings
from ..core.status import Status
from ..measure import client, clientcheck, datasets, loops, metrics, precision, prompts, stats, telemetry
from ..measure import records as requests_table
from ..workloads import Cell, CellRun
from .job import JobContext

MAX_FAILED_FRACTION = 0.5
# idle keep-alive connections of the cell's own session (prompts, counters) are dropped after this long:
# below the server's keep-alive (vLLM: VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s), or a call after a window reuses
# a connection the server is closing ("Can not write request body", seen after a 4 s decode window)
SESSION_KEEPALIVE_S = 1.0


def needed_kv_tokens(cell: Cell) -> int:
    """KV tokens the cell needs at once (its kind decides: every request at full context plus its cap)."""
    return cell.kind.needed_kv_tokens(cell)


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
        samples = await client.scrape(session, url)
        busy = metrics.in_flight(samples)
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
        async with client.control_session(timeout_s=10) as session:
            while True:
                got = metrics.in_flight(await client.scrape(session, self.url))
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
    async with client.control_session() as session:
        return await client.scrape(session, url)


def request_options(cell: Cell, settings: ClientSettings, loop_cfg: dict[str, Any] | None = None,
                    eos_text: str | None = None) -> client.RequestOptions:
    """The cell's request options. ``usage_per_chunk`` ``auto`` (the default) asks for per-event
    token counts only where they are needed to be exact: a decode cell cuts its requests at the
    window's end, before their final usage event. The other cells run every request to its end,
    and the final usage event gives its exact total at no cost to the server."""
    per_chunk = settings.usage_per_chunk
    if per_chunk == "auto":
        per_chunk = cell.kind.cut_at_window_end
    sampling = cell.sampling_params
    return client.RequestOptions(
        max_tokens=cell.kind.request_max_tokens(cell),
        stall_timeout_s=float(settings.stall_timeout_s),
        ignore_eos=settings.ignore_eos,
        usage_per_chunk=bool(per_chunk),
        stop_looping=settings.stop_looping,
        loop_thresholds={k: v for k, v in (loop_cfg or {}).items() if k in loops.DEFAULTS},
        eos_text=eos_text,
        api=settings.api,
        chat_template_kwargs=settings.chat_template_kwargs,
        temperature=float(sampling.get("temperature", 0.0)),
        top_p=sampling.get("top_p"),
        seed=sampling.get("seed"),
        frequency_penalty=sampling.get("frequency_penalty"),
    )


@dataclass
class MeasureInput:
    """Where and how one cell is measured (the cell itself aside): the server, the client's settings,
    and what the run knows of the server (its model's end-of-text text, GPUs, KV cache, tokenizer)."""

    url: str
    model: str  # the served model name
    client: ClientSettings
    loops: dict[str, Any] | None = None  # the loop thresholds (client.stop_looping ends requests under them)
    eos_text: str | None = None
    gpu_env: dict[str, str] | None = None  # its CUDA_VISIBLE_DEVICES: the GPUs the telemetry samples
    kv_tokens_fallback: int | None = None  # the KV cache size the server logged, where /metrics lacks it
    tokenizer_dir: str | None = None  # the model's files: prompts wanted in a window are made here
    progress: Callable[[str], None] = print
    # a dataset cell's records (speedmatrix.measure.datasets.Record), in the dataset's order
    dataset: list | None = None


def _tagged(made: list[prompts.Prompt], id_lists: list[list[int]]) -> list[prompts.Prompt]:
    """Made prompts with what their ids carried of a dataset record (category, output cap)."""
    return [replace(p, category=getattr(ids, "category", None), max_tokens=getattr(ids, "max_tokens", None))
            if isinstance(ids, prompts.Tagged) else p for p, ids in zip(made, id_lists)]


class _Prompts:
    """A cell's prompts: cut from the corpus the server's tokenizer reads, made exact as text by the
    server (``build``), and while a window measures by the local tokenizer instead (``in_window``,
    counting the calls the server had to make where there is none)."""

    def __init__(self, session: aiohttp.ClientSession, cell: Cell, inp: MeasureInput, seed: int, nonce: str) -> None:
        self.session, self.cell, self.inp, self.seed, self.nonce = session, cell, inp, seed, nonce
        self.server_calls_in_window = 0
        self.local = None

    async def open(self) -> _Prompts:
        inp, cell = self.inp, self.cell
        if inp.dataset is not None and not cell.kind.reads_trace:
            self.source = await prompts.from_dataset(self.session, inp.url, inp.model, inp.dataset, seed=self.seed,
                                                     nonce=self.nonce, headers=client.auth_headers())
        else:
            self.source = await prompts.from_server(self.session, inp.url, inp.model, seed=self.seed,
                                                    kind="prose" if cell.kind.reads_trace else cell.corpus,
                                                    nonce=self.nonce, headers=client.auth_headers())
        self.aligner = (prompts.TextAligner(self.session, inp.url, inp.model, client.auth_headers())
                        if inp.client.prompt_format == "text" else None)
        # prompts wanted while a window measures are made with the model's tokenizer on this machine,
        # never with calls to the server being measured (checked against the server's count first)
        local = prompts.local_aligner(inp.tokenizer_dir) if self.aligner else None
        if local is not None:
            sample = await local.many([self.source.prompt(i, cell.context_tokens, "check") for i in range(2)],
                                      self.source.corpus_ids[:256])
            if not await local.agrees_with(self.aligner, sample):
                inp.progress("the local tokenizer counts prompts differently from the server's: decode prompts "
                             "are built ahead by the server only")
                local = None
        self.local = local
        return self

    async def build(self, id_lists: list[list[int]]) -> list:
        """The prompts as sent: text checked by the server's tokenizer, or the ids themselves (a dataset
        prompt's category and output cap kept)."""
        if not self.aligner:
            return id_lists
        return _tagged(await self.aligner.many(id_lists, self.source.corpus_ids[:256]), id_lists)

    async def in_window(self, id_lists: list[list[int]]) -> list:
        """Prompts wanted while a window measures: local where the tokenizer is here, else the server's
        (counted: the cell says how many it had to make that way)."""
        if self.local is not None:
            return _tagged(await self.local.many(id_lists, self.source.corpus_ids[:256]), id_lists)
        if self.aligner is not None:
            self.server_calls_in_window += len(id_lists)
        return await self.build(id_lists)

    def provenance(self, records: list[client.RequestRecord]) -> dict[str, Any]:
        """How the prompts were made, for the result; said in the log where it matters."""
        if self.server_calls_in_window:
            self.inp.progress(f"{self.server_calls_in_window} prompts were made by the server while a window "
                              "measured (no local tokenizer): the server did that work on top of the cell's")
        if self.aligner and self.aligner.fallbacks:
            self.inp.progress(f"{self.aligner.fallbacks} prompt(s) could not be made exact as text and were sent "
                              "as token ids")
        skipped = getattr(self.source, "skipped", {}).get(self.cell.context_tokens)
        if skipped:
            self.inp.progress(f"{skipped} dataset prompt(s) longer than the {self.cell.context_tokens}-token context "
                              "were skipped")
        return {
            **({"dataset_prompts_skipped": skipped} if skipped is not None else {}),
            "prompt_builder": ("local tokenizer" if self.local is not None else
                               "server" if self.aligner is not None else "token ids"),
            "prompts_built_by_server_in_window": self.server_calls_in_window,
            "prompts_sent_as_token_ids": sum(1 for r in records if r.prompt_format == "token_ids"),
        }


async def _repeats(session: aiohttp.ClientSession, cell: Cell, inp: MeasureInput, opts: client.RequestOptions,
                   made: _Prompts, before_raw: dict[str, Any], kv: int | None, sampler: GaugeSampler) -> tuple:
    """The cell's repeats, one after another: (figures combined, passes combined, records, wall-clock start).
    ``figures["requests_s"]``: the seconds the kind's ``measure`` ran, repeats summed (requests in flight, and
    what a kind sends outside its window: a prefix-cache cell's cold pass, a prefill cell's requests)."""
    per_repeat, per_passes, records = [], [], []
    t_wall, requests_s = None, 0.0
    busy_wait_s = float(inp.client.busy_wait_s)
    # a cell with a stopping rule measures again only while its figure is not precise enough (at most `repeats`)
    rule = precision.Precision.of(cell.precision_settings) if cell.precision else None
    most = "at most " if rule is not None and rule.enabled else ""
    look: dict[str, Any] = {}
    for k in range(1, cell.repeats + 1):
        if k > 1:  # the previous repeat's requests have drained (a cut decode request is aborted)
            await wait_until_idle(session, inp.url, busy_wait_s, inp.progress)
            inp.progress(f"repeat {k} of {most}{cell.repeats}")
        run = CellRun(cell, inp.url, inp.model, opts, made.source, made.build, before_raw, inp.client, inp.progress,
                      scrape=lambda: _counters(inp.url), repeat=k, build_in_window=made.in_window, kv_tokens=kv,
                      records=inp.dataset, earlier=list(per_repeat))
        prepared = await cell.kind.prepare(run)  # prompts are built before the clock starts
        if t_wall is None:
            t_wall = time.time()
            sampler.start()
        async with clientcheck.ClientCheck() as check:
            measured = await cell.kind.measure(run, prepared)
        requests_s += check.wall_s
        client_check(measured.figures, check.figures(measured.records), inp.client, check.wall_s)
        for r in measured.records:  # request indices stay unique over the cell's repeats
            r.index += len(records)
            r.repeat = k
        records += measured.records
        per_repeat.append(measured.figures)
        if measured.passes:
            per_passes.append(measured.passes)
        if rule is not None:
            look = precision.cell_stop(rule, per_repeat, cell.repeats)
            if look["stop"]:
                break
    figures = stats.combine(per_repeat, worst=clientcheck.FIGURES)
    passes = {ph: stats.combine([p[ph] for p in per_passes]) for ph in per_passes[0]} if per_passes else {}
    if len(per_repeat) > 1:
        figures["repeat_figures"] = per_repeat  # each repeat's own figures, in order
    if look:  # the cell's precision: why it stopped, what it reached (its windows' own: in repeat_figures)
        figures.update({k: v for k, v in look.items() if k != "stop"})
    figures["requests_s"] = round(requests_s, 3)
    return figures, passes, records, t_wall


def client_check(figures: dict[str, Any], checked: dict[str, Any], settings: ClientSettings, took_s: float) -> None:
    """A measurement's figures get the client check's (clientcheck), and Client-bound where the client set them:
    an open loop's own verdict on its send lag gains the reason; a saturated server's queue, measured by a
    client that could not keep up, is the client's too."""
    figures.update(checked)
    reason = clientcheck.verdict(checked, settings, took_s)
    if reason is None:
        return
    if figures.get("status") == Status.CLIENT_BOUND:
        figures["status_reason"] = f"{figures.get('status_reason')}; {reason}"
    else:
        figures["status"], figures["status_reason"] = Status.CLIENT_BOUND, reason


def _check(cell: Cell, url: str, records: list[client.RequestRecord], finished: float | None,
           gauges: dict[str, Any]) -> None:
    """CellError where the figures would not be this cell's: nothing sent, most requests failed, or the
    server served requests that were not the cell's while it measured."""
    n = len(records)
    failed = sum(1 for r in records if r.error)
    if n == 0:
        raise CellError("no request was sent")
    if failed == n or failed / n > MAX_FAILED_FRACTION:
        kinds = sorted({r.error for r in records if r.error})[:3]
        raise CellError(f"{failed} of {n} requests failed: {'; '.join(kinds)}")
    peak = gauges["server_running_max"]
    bound = cell.kind.in_flight_bound(cell, n)
    if ((peak is not None and peak + (gauges["server_waiting_max"] or 0) > bound)
            or (finished is not None and finished > n)):
        raise CellError(
            f"the server at {url} served requests that were not this cell's during it (it finished "
            f"{finished if finished is None else int(finished)} requests, the cell sent {n}; most running at once "
            f"{peak if peak is None else int(peak)}, the cell's bound {bound}): the figures "
            "are not this cell's. Give the benchmark the server to itself and run again.")


def _asked(opts: client.RequestOptions, settings: ClientSettings, nonce: str, cell: Cell) -> dict[str, Any]:
    """What the cell's requests asked for, and the prefix-cache state it starts from, as its result records it."""
    return {"prefix_cache_state": cell.kind.cache_state, "ignore_eos": opts.ignore_eos,
            "usage_per_chunk": opts.usage_per_chunk, "stop_looping": opts.stop_looping,
            "prompt_format": settings.prompt_format, "api": opts.api,
            "chat_template_kwargs": opts.chat_template_kwargs, "prompt_seed": settings.seed, "prompt_nonce": nonce}


async def measure(cell: Cell, inp: MeasureInput) -> tuple[dict[str, Any], list[client.RequestRecord]]:
    """Measure one cell against a running server: (result, per-request records).

    Where NVML answers, the server's GPUs (``inp.gpu_env``'s CUDA_VISIBLE_DEVICES,
    else all) are sampled while the cell's requests run (speedmatrix.measure.telemetry).

    Server counters are scraped before and after (and between the passes of a
    prefix-cache cell); against a server without vLLM's metrics every counter
    field is recorded as absent (None) and the cell still runs.
    """
    settings, url, progress = inp.client, inp.url, inp.progress
    opts = request_options(cell, settings, inp.loops, inp.eos_text)
    busy_wait_s = float(settings.busy_wait_s)
    nonce = secrets.token_hex(4)
    # this HTTP session stays open through the measurement: it builds text prompts a decode cell needs late
    async with client.control_session(keepalive_s=SESSION_KEEPALIVE_S) as session:
        before_raw = await client.scrape(session, url)
        kv = metrics.cache_info(before_raw)["kv_cache_size_tokens"] or inp.kv_tokens_fallback
        need = needed_kv_tokens(cell)
        base = _asked(opts, settings, nonce, cell) | {"kv_cache_size_tokens": kv, "needed_kv_tokens": need,
                                                      "server_metrics": "present" if before_raw else "absent"}
        if kv is not None and need > kv:
            progress(f"over capacity: needs {need} KV tokens, the server has {kv}; not sent")
            return {**base, "status": Status.OVER_CAPACITY}, []
        before_raw = await wait_until_idle(session, url, busy_wait_s, progress)
        made = await _Prompts(session, cell, inp, settings.seed, nonce).open()
        sampler = GaugeSampler(url, float(settings.metrics_interval_s))
        gpu = telemetry.Sampler(env=inp.gpu_env)  # no NVML (the CPU default): samples nothing, returns None
        gpu.start()
        try:
            figures, passes, records, t_wall = await _repeats(session, cell, inp, opts, made, before_raw, kv, sampler)
        except BaseException:
            gpu.stop()
            raise
        gpu_summary = gpu.stop(figures.get("total_output_tokens"))
    gauges = await sampler.stop()
    async with client.control_session() as session:
        # every request of the cell has ended on the client; the server must drain too (a request cut
        # at a decode window's end is aborted within moments); still busy means someone else's requests
        after_raw = await wait_until_idle(session, url, busy_wait_s, progress)
    counters = metrics.delta(metrics.snapshot(before_raw), metrics.snapshot(after_raw))
    received, gen = sum(r.output_tokens for r in records), counters.get("server_generation_tokens")
    base.update(made.provenance(records),
                loops_seen_online=sum(1 for r in records if r.loop_detected_at_token is not None),
                requests_stopped_for_loop=sum(1 for r in records if r.stopped_for_loop),
                cached_prompt_share=stats.cached_share(records))
    finished = counters.get("server_requests_finished")  # the whole cell's, both passes of a prefix-cache cell
    if passes:  # a prefix-cache cell's headline figures are its warm pass's
        counters.update({k: passes["warm"][k] for k in metrics.DELTA_KEYS})
    _check(cell, url, records, finished, gauges)
    result = {
        **base,
        "status": Status.VALID,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t_wall)),
        "server_running_before": (metrics.in_flight(before_raw) or (None,))[0],
        **figures,
        **counters,
        **gauges,
        # every token the client received (a decode cell's window counts fewer), and what the server
        # counted: equal for cells whose requests all run to their end
        "client_output_tokens": received,
        "token_count_gap": None if gen is None else gen - received,
    }
    if gpu_summary:
        per_gpu = gpu_summary.pop("per_gpu")
        result.update(gpu_summary)
        result["gpu_per_gpu"] = per_gpu
    if passes:
        result["passes"] = passes
    return result, records


def request_table(records: list[client.RequestRecord], ident: dict[str, Any]) -> pd.DataFrame:
    """``requests.parquet``: the cell's identity columns, then every column of ``records.COLUMNS``."""
    return requests_table.frame(records, ident=ident)


def write(cell_json: str, requests_parquet: str, result: dict[str, Any], records: list[client.RequestRecord],
          ident: dict[str, Any]) -> None:
    """Write the per-request table first, the cell JSON last: the JSON marks a finished cell."""
    table = request_table(records, ident)
    tmp = f"{requests_parquet}.tmp-{os.getpid()}"
    table.to_parquet(tmp, index=False)
    os.replace(tmp, requests_parquet)
    atomic.write_json(cell_json, result)


def measurement_key(cell: Cell, launch: dict[str, Any], lock: dict[str, Any], measured_with: dict[str, Any]) -> str:
    """What a measurement depends on: the cell, the exact server launch, the runtime, and the client
    settings and loop thresholds that shape it (``Experiment.measured_with``)."""
    basis = {
        "cell": cell.as_dict(),
        "argv": launch["argv"],
        "env": launch["env"],
        "models": launch["models"],
        "packages_sha256": lock.get("packages_sha256"),
        "runtime_ref": lock.get("runtime_ref"),  # a container image's digest
        **measured_with,
    }
    return hashlib.sha256(json.dumps(basis, sort_keys=True, default=str).encode()).hexdigest()[:20]


def archived(results_dir: Path, server_id: str, cell_id: str, key: str) -> tuple[Path, Path]:
    """Where the measurement archive keeps this measurement (a copy made under the archive's earlier name is read
    where it is)."""
    run = runfolder.RunFolder(results_dir)
    here = run.archived(server_id, cell_id, key)
    before = run.archived(server_id, cell_id, key, runfolder.ARCHIVE_BEFORE)
    return before if not here[0].exists() and before[0].exists() else here


def restore(stored_json: Path, stored_requests: Path, out_json: str, out_requests: str) -> bool:
    """Copy an archived measurement into the cell's outputs (byte for byte); False if there is none."""
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


def run(job: JobContext, cell_spec: dict[str, Any], measured_with: dict[str, Any], loop_settings: dict[str, Any],
        out_json: str, out_requests: str) -> dict:
    """The cell rule: acquire the server (starting it if needed), measure, write once.

    The rule hands the job everything it needs: the cell (``Cell.as_dict``, with its dataset's spec under
    ``dataset``), what the measurement depends on besides the cell and the launch (``Experiment.measured_with``:
    the client settings, the loop thresholds when they end requests), and the loop thresholds the online watch
    uses; the job expands nothing.

    A good measurement is first written to the run's measurement archive
    (``<results>/<experiment>/archive/``, keyed by everything it depends on) and
    then to the cell's outputs. If Snakemake removes the outputs of a cell
    that had finished (it does so for every member of a failed group job on a
    cluster), the next run restores them from the archive instead of measuring
    again, without starting a server.
    """
    launch, server_id = job.launch, job.server_id
    cell = Cell.from_dict(cell_spec)
    cell_id = cell.id
    client_cfg = ClientSettings(**measured_with["client"])
    progress = print
    progress(f"cell {server_id}/{cell_id}: {cell.as_dict()}")
    job.use_api_key()
    spec = cell_spec.get("dataset")
    records, dataset_lock = datasets.load(cell.corpus, spec) if spec else (None, None)
    # a dataset cell's measurement depends on the dataset's content too (the others' keys stay as they were)
    key = measurement_key(cell, launch, job.lock, {**measured_with, **({"dataset": dataset_lock} if spec else {})})
    stored_json, stored_requests = archived(job.results, server_id, cell_id, key)
    if restore(stored_json, stored_requests, out_json, out_requests):
        doc = atomic.read_json(out_json)
        progress(f"restored from the measurement archive {stored_json} (measured "
                 f"{doc['result'].get('started_at', 'earlier')}); not measured again")
        return doc
    with job.server(progress) as info:
        startup = info["startup"]
        progress(f"server {server_id} start {startup['start_id']} at {info['url']} "
                 f"(KV cache {startup.get('kv_cache_size_tokens')} tokens)")
        inp = MeasureInput(info["url"], launch["served_model_name"], client_cfg, loop_settings, launch.get("eos_text"),
                           gpu_env(launch, info), startup.get("kv_cache_size_tokens"), launch.get("model_dir"),
                           progress, dataset=records)
        result, records = asyncio.run(measure(cell, inp))
        if result.get("failed"):
            # requests failed: keep the cell only if its server is still the same healthy server
            # (a killed server closes its sockets while it is still exiting, so look twice)
            time.sleep(1.0)
            if not job.server_healthy(info):
                log = Path(info["state_dir"]) / "server.log"
                raise CellError(f"the server of {server_id} died during the cell; {result['failed']} requests "
                                f"failed ({result['errors_by_kind']}); see {log}")
    # the other cells that measured while this one did (a GPU pool runs configs side by side)
    result["beside"] = info.get("beside") or []
    if dataset_lock:
        result["dataset"] = dataset_lock  # its source, revision and hash: part of the cell's provenance
    doc = {
        "experiment": job.experiment_name,
        "cell": cell.as_dict(),
        "server": {"server_id": server_id, "model": launch["model"], "spec_tokens": launch["spec_tokens"],
                   "spec_method": launch.get("spec_method"),
                   "served_model_name": launch["served_model_name"], "sweep": launch.get("sweep"),
                   "sweep_values": launch.get("sweep_values") or {}},
        "client": client_cfg.as_dict(),
        "result": result,
        "provenance": job.provenance(startup),
    }
    doc["measurement_key"] = key
    ident = {"experiment": job.experiment_name, "server_id": server_id, "cell_id": cell_id}
    stored_json.parent.mkdir(parents=True, exist_ok=True)
    write(str(stored_json), str(stored_requests), doc, records, ident)
    restore(stored_json, stored_requests, out_json, out_requests)
    progress(f"done: status {result['status']}, output_throughput {result.get('output_throughput')}")
    return doc
