"""The benchmark client: streaming OpenAI-compatible completions, measured per chunk.

One request is one streamed ``/v1/completions`` call. Every chunk's arrival
time and token count is kept (token counts from vLLM's continuous usage
stats when present, else one per non-empty chunk), so every figure of a cell
is derived afterwards from the raw records (see :mod:`speedmatrix.cellstats`).
A request ends with a recorded reason, never hangs: a stalled stream
(no chunk for ``stall_timeout_s``), an HTTP error, a malformed event or a
dropped connection each end it with ``error`` set.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import msgspec

from . import metrics
from .loops import OnlineWatch

API_KEY_ENV = "SPEEDMATRIX_API_KEY"
# where a client finds the server's key, in order: speedmatrix's own variable, then the OpenAI clients' one
API_KEY_SOURCES = (API_KEY_ENV, "OPENAI_API_KEY")


def api_key() -> str | None:
    """The key the server wants, from the environment only (never argv, a file or a log)."""
    for name in API_KEY_SOURCES:
        if os.environ.get(name):
            return os.environ[name]
    return None


def auth_headers() -> dict[str, str]:
    key = api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


def sampling_body(ignore_eos: bool, temperature: float = 0.0, top_p: float | None = None,
                  seed: int | None = None, frequency_penalty: float | None = None) -> dict[str, Any]:
    """What every request of a measurement asks of the sampler, whichever client sends it: greedy unless a
    temperature is given (then with ``top_p`` and the request's ``seed``, so a rerun samples the same), a
    ``frequency_penalty`` where given, and with ``ignore_eos`` special tokens kept as text (every token
    streamed has text: random weights can emit nothing but special tokens)."""
    return {"temperature": temperature, **({"top_p": top_p} if top_p is not None else {}),
            **({"seed": seed} if seed is not None else {}),
            **({"frequency_penalty": frequency_penalty} if frequency_penalty is not None else {}),
            "ignore_eos": ignore_eos, **({"skip_special_tokens": False} if ignore_eos else {})}


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning: str | None = None  # the model's thinking (vLLM's reasoning parser)
    reasoning_content: str | None = None  # its older name


class _Choice(msgspec.Struct):
    text: str | None = None  # /v1/completions
    delta: _Delta | None = None  # /v1/chat/completions
    finish_reason: str | None = None
    token_ids: list[int] | None = None  # the event's tokens, where the request asked (return_token_ids)


class _Details(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    # the prompt's tokens served from the prefix cache (vLLM with --enable-prompt-tokens-details)
    prompt_tokens_details: _Details | None = None


class _Event(msgspec.Struct):
    """The fields of a streamed completion event the client reads (the rest is skipped, not parsed)."""
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: Any = None


_decode_event = msgspec.json.Decoder(_Event).decode


@dataclass(frozen=True)
class RequestOptions:
    """What every request of a cell asks for, and how long the client waits for a token."""

    max_tokens: int
    stall_timeout_s: float = 60.0
    ignore_eos: bool = False
    # Ask the server for the running token count in every event (vLLM's continuous_usage_stats):
    # exact tokens per event even when one carries several (speculative decoding, a lagging API
    # server) and for a request cut at a window's end. It costs the server work per event; without
    # it the final usage event gives each finished request's exact total (docs/fidelity.md).
    usage_per_chunk: bool = True
    # the online loop watch (speedmatrix.measure.loops.OnlineWatch) runs on every stream; with stop_looping a
    # request whose output loops is ended there (finish_reason "loop"), sparing the server the rest
    watch_loops: bool = True
    stop_looping: bool = False
    loop_thresholds: dict[str, Any] = field(default_factory=dict)
    # with ignore_eos, special tokens are kept in the output (skip_special_tokens false): every token
    # streamed has text, and with eos_text (the model's end-of-text token as text) the client sees
    # where the model had ended (natural_end_char). Random weights can emit special tokens and nothing
    # else (the 31B shape on the H200: <pad> after <pad>); every client of an agreement asks the same
    eos_text: str | None = None
    # "completions" (/v1/completions, the prompt as given) or "chat" (/v1/chat/completions: the
    # prompt text as one user message, through the model's chat template with chat_template_kwargs,
    # e.g. {"enable_thinking": false} as seed 003 asks)
    api: str = "completions"
    chat_template_kwargs: dict[str, Any] | None = None
    # sampling (a cell's ``sampling``): 0 is greedy; request i is sent with seed ``seed + i``
    temperature: float = 0.0
    top_p: float | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    # ask for the output's token ids with every event (multi-turn sessions send them back as the history)
    return_token_ids: bool = False

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"

    def payload(self, model: str, prompt: list[int] | str, index: int = 0, max_tokens: int | None = None
                ) -> dict[str, Any]:
        """The request's body; ``max_tokens``: a dataset prompt's own cap (the cell's caps it)."""
        extra: dict[str, Any] = {}
        if self.api == "chat":
            if not isinstance(prompt, str):
                raise ValueError("the chat API takes text prompts (client.prompt_format: text)")
            extra["messages"] = [{"role": "user", "content": prompt}]
            if self.chat_template_kwargs:
                extra["chat_template_kwargs"] = self.chat_template_kwargs
        else:
            extra["prompt"] = prompt
        return {
            **extra,
            "model": model,
            "max_tokens": self.max_tokens if max_tokens is None else max(1, min(max_tokens, self.max_tokens)),
            **sampling_body(self.ignore_eos, self.temperature, self.top_p,
                            None if self.seed is None else self.seed + index, self.frequency_penalty),
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": self.usage_per_chunk},
            **({"return_token_ids": True} if self.return_token_ids else {}),
        }


@dataclass
class RequestRecord:
    index: int
    worker: int
    prompt_tokens: int
    start: float  # seconds since the cell's t0
    first_token: float | None = None
    end: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    chunk_chars: list[int] = field(default_factory=list)  # characters of text each counted event brought
    text: str = ""
    finish_reason: str | None = None
    cut_at_window_end: bool = False
    error: str | None = None
    phase: str = ""  # prefix-cache cells: "cold" or "warm"
    repeat: int = 1  # which of the cell's repeats sent it
    prompt_format: str = "token_ids"  # or "text" (checked to be prompt_tokens long by the server's tokenizer)
    loop_detected_at_token: int | None = None  # the online watch saw a loop when this many tokens had come
    natural_end_char: int | None = None  # with ignore_eos: where the model's end-of-text token came
    stopped_for_loop: bool = False
    # tokens the final usage event added to (or took from) the events' count: spread evenly over the
    # events (only without per-event usage, when an event carried several tokens)
    tokens_reconciled: int = 0
    # the prompt's length as the server counted it (final usage event); with the chat API it
    # includes the chat template's tokens around the prompt text
    server_prompt_tokens: int | None = None
    # open loop (rate cells): when the schedule said to send it (seconds since t0; ``start`` is when it was sent),
    # and whether the cell's figures count it (a warm-up request is sent and not counted)
    scheduled: float | None = None
    counted: bool = True
    # a dataset prompt: its record's category, and its own output cap (its reference output's length)
    category: str | None = None
    max_tokens: int | None = None
    # the prompt's tokens the server served from its prefix cache (its usage's prompt_tokens_details; None where
    # the server does not report it)
    cached_tokens: int | None = None
    # the output's token ids, where the request asked for them (return_token_ids); not in requests.parquet
    output_ids: list[int] = field(default_factory=list)
    # a multi-turn session's request: which session and turn it is (0: not a session's)
    session: int | None = None
    turn: int | None = None
    # when the request's body was handed to the socket (seconds since t0): its time inside the client is from
    # when it was due (``scheduled`` in an open loop, else ``start``) to this (clientcheck)
    sent: float | None = None

    @property
    def output_tokens(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def client_wait_s(self) -> float | None:
        """From when the request was due (its scheduled send in an open loop, else when the client began it) to
        when its bytes left: the time it spent inside the client (a late wake-up, the connection pool, the loop)."""
        if self.sent is None:
            return None
        return self.sent - (self.scheduled if self.scheduled is not None else self.start)

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: from the request's send to its first token's arrival (None: no token came).
        The one definition every figure, table and target of TTFT reads."""
        return None if self.first_token is None else self.first_token - self.start

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Decoder:
    """A stream's events into its record: text, tokens per event (the server's running count when it
    sends one, else one per event with text) and the finish reason; ``feed`` says when the stream ends."""

    __slots__ = ("record", "last_usage", "held_chars", "parts")

    def __init__(self, record: RequestRecord) -> None:
        self.record = record
        self.last_usage = 0
        self.held_chars = 0  # text of events that brought no token yet (joins the next counted event)
        self.parts: list[str] = []  # joined once at the end (appending to an attribute copies the text)

    def feed(self, events: list[bytes], arrived: float) -> bool:
        """Take the whole events that arrived at ``arrived``; True when the stream has ended
        ([DONE], a malformed event or an error event: ``record.error`` says which)."""
        # the per-event state in locals while the events are read (the hot path), written back once
        record, parts = self.record, self.parts
        last_usage, held_chars, ended = self.last_usage, self.held_chars, False
        for event in events:
            line = event.strip()
            if not line.startswith(b"data:"):
                continue
            body = line[5:].strip()
            if body == b"[DONE]":
                ended = True
                break
            try:
                msg = _decode_event(body)
            except msgspec.DecodeError:
                record.error = f"malformed event: {body[:120]!r}"
                ended = True
                break
            if msg.error is not None:
                record.error = f"server error event: {str(msg.error)[:200]}"
                ended = True
                break
            usage = msg.usage.completion_tokens if msg.usage is not None else None
            if not msg.choices:
                if usage is not None:  # the final usage event: the request's exact total
                    _reconcile(record, usage)
                    record.server_prompt_tokens = msg.usage.prompt_tokens
                    details = msg.usage.prompt_tokens_details
                    record.cached_tokens = details.cached_tokens if details is not None else None
                continue
            choice = msg.choices[0]
            text = choice.text
            if choice.delta is not None:  # chat: the answer, or the model's thinking (a token too)
                d = choice.delta
                text = d.content or d.reasoning or d.reasoning_content
            if usage is not None:
                n = usage - last_usage
                last_usage = usage
            else:
                # a completions event carries at least one token (the final usage corrects the count);
                # a chat event without text (the opening role event, a closing event) carries none
                n = 1 if (text or choice.delta is None) else 0
            if text:
                parts.append(text)
            if choice.token_ids:
                record.output_ids.extend(choice.token_ids)
            if n > 0:
                if record.first_token is None:
                    record.first_token = arrived
                record.chunk_times.append(arrived)
                record.chunk_tokens.append(n)
                record.chunk_chars.append(held_chars + len(text or ""))
                held_chars = 0
            elif text:
                held_chars += len(text)
            if choice.finish_reason:
                record.finish_reason = choice.finish_reason
        self.last_usage, self.held_chars = last_usage, held_chars
        return ended


async def _read(resp: aiohttp.ClientResponse, record: RequestRecord, stall_timeout_s: float,
                deadline: float | None) -> bytes | None:
    """The next bytes of the stream; None when reading ends here: the window's deadline passed
    (``cut_at_window_end``), nothing came for ``stall_timeout_s`` or the stream closed (``error``)."""
    timeout = stall_timeout_s
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            record.cut_at_window_end = True
            return None
        timeout = min(timeout, left)
    try:
        # asyncio.timeout, not wait_for: no task per read (the client's cost per chunk matters)
        async with asyncio.timeout(timeout):
            data = await resp.content.readany()
    except TimeoutError:
        if deadline is not None and time.monotonic() >= deadline:
            record.cut_at_window_end = True
        else:
            record.error = f"stalled: no data for {stall_timeout_s:g} s"
        return None
    if not data:
        if record.finish_reason is None:
            record.error = "connection closed before the stream finished"
        return None
    return data


async def _refused(resp: aiohttp.ClientResponse) -> str | None:
    """Why a response is not a stream to read (an HTTP error, another content type), else None."""
    if resp.status != 200:
        return f"HTTP {resp.status}: {(await resp.text())[:300]}"
    if resp.content_type != "text/event-stream":
        body = (await resp.text())[:200]
        return f"unexpected content type {resp.content_type or '(none)'}: not a stream: {body!r}"
    return None


async def stream_completion(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    prompt: list[int] | str,
    opts: RequestOptions,
    record: RequestRecord,
    t0: float,
    deadline: float | None = None,
    headers: dict[str, str] | None = None,
) -> RequestRecord:
    """Stream one completion into ``record``; stop reading at ``deadline`` (monotonic).

    The HTTP call and the read loop are here; reading with the deadline and the stall timeout is
    ``_read``, the events' decoding and token accounting ``_Decoder``, the loop watch
    ``loops.OnlineWatch``."""
    watch = OnlineWatch(**opts.loop_thresholds) if opts.watch_loops else None
    decoder = _Decoder(record)
    try:
        body = opts.payload(model, prompt, record.index, record.max_tokens)
        async with session.post(f"{base_url}{opts.path}", json=body, trace_request_ctx=(record, t0),
                                headers=auth_headers() if headers is None else headers) as resp:
            record.error = await _refused(resp)
            buf = b""
            while record.error is None:
                data = await _read(resp, record, opts.stall_timeout_s, deadline)
                if data is None:
                    break
                arrived = time.monotonic() - t0
                if deadline is not None and arrived > deadline - t0:
                    # arrived after the window's end (the read raced the deadline): not part of the window,
                    # so a cut request's tokens are exactly those the window counts
                    record.cut_at_window_end = True
                    break
                *events, buf = (buf + data).split(b"\n\n")  # one pass over what arrived (linear in its size)
                if decoder.feed(events, arrived):
                    break
                if watch is not None and len(decoder.parts) >= watch.next_at and watch.update(decoder.parts):
                    record.loop_detected_at_token = sum(record.chunk_tokens)
                    watch = None  # one verdict a stream
                    if opts.stop_looping:
                        record.stopped_for_loop = True
                        record.finish_reason = "loop"
                        break
    except (aiohttp.ClientError, ConnectionError, OSError) as exc:
        record.error = f"connection error: {type(exc).__name__}: {exc}"[:300]
    finally:
        record.end = time.monotonic() - t0
        record.text = "".join(decoder.parts)
        if opts.ignore_eos and opts.eos_text:
            at = record.text.find(opts.eos_text)
            record.natural_end_char = at if at >= 0 else None
    return record


PromptLike = Any  # a list of token ids, or a speedmatrix.measure.prompts.Prompt (text with its token count)


def _unpack(p: PromptLike) -> tuple[str | list[int], int, dict[str, Any]]:
    """(what to send, its token count, what its request records of it: format, a dataset's category and
    output cap)."""
    tags = {"category": getattr(p, "category", None), "max_tokens": getattr(p, "max_tokens", None)}
    if isinstance(p, list):
        return list(p), len(p), {"prompt_format": "token_ids", **tags}
    return p.value, p.tokens, {"prompt_format": p.format, **tags}


async def _resolve(make_prompt: Callable[[int], Any], i: int) -> tuple[str | list[int], int, dict[str, Any]]:
    """Request i's prompt, unpacked; make_prompt may be async."""
    p = make_prompt(i)
    return _unpack(await p if inspect.isawaitable(p) else p)


def _reconcile(record: RequestRecord, total: int) -> None:
    """Make the events' token counts add up to the server's total, spreading any difference evenly."""
    diff = total - sum(record.chunk_tokens)
    if diff == 0 or not record.chunk_tokens:
        return
    record.tokens_reconciled = diff
    k = len(record.chunk_tokens)
    # the first event follows prefill and carries one token; spread over the decode events after it
    idx = list(range(1, k)) if k > 1 else [0]
    if diff > 0:
        base, extra = divmod(diff, len(idx))
        for j, i in enumerate(idx):
            record.chunk_tokens[i] += base + (1 if j < extra else 0)
    else:
        for i in reversed(range(k)):  # fewer tokens than events: take them from the last events
            take = min(-diff, record.chunk_tokens[i])
            record.chunk_tokens[i] -= take
            diff += take
            if diff == 0:
                break


async def _body_sent(_session: aiohttp.ClientSession, ctx: Any, _params: Any) -> None:
    """aiohttp's trace hook, as the request's body is written to the socket: its record keeps the moment, since
    the cell's t0 (``stream_completion`` hands both over as the request's trace context)."""
    if ctx.trace_request_ctx is not None:
        record, t0 = ctx.trace_request_ctx
        if record.sent is None:
            record.sent = time.monotonic() - t0


def _tracing() -> aiohttp.TraceConfig:
    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(_body_sent)
    return trace


def control_session(timeout_s: float = 60.0, keepalive_s: float | None = None) -> aiohttp.ClientSession:
    """One HTTP session for a server's control endpoints (``/metrics``, ``/tokenize``, ``/detokenize``), not for
    measuring: each call ends within ``timeout_s``; ``keepalive_s`` keeps its connection for later calls."""
    connector = aiohttp.TCPConnector(keepalive_timeout=keepalive_s) if keepalive_s is not None else None
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s), connector=connector)


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """The server's Prometheus samples (``metrics.parse``); {} when it has no /metrics (then every counter field is
    absent)."""
    try:
        async with session.get(f"{url}/metrics", headers=auth_headers()) as resp:
            if resp.status != 200:
                return {}
            return metrics.parse(await resp.text())
    except (aiohttp.ClientError, ValueError):
        return {}


def session_for(concurrency: int | None) -> aiohttp.ClientSession:
    """One HTTP session for a measurement: a connection per request in flight (None: no limit, an open loop's:
    a limit would hold a request back inside the HTTP library), no overall timeout (a request ends by its own
    stall timeout or the cell's window); each request's record keeps when its body left (``sent``)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0 if concurrency is None else concurrency + 4),
                                 timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
                                 trace_configs=[_tracing()])


class Window:
    """A closed loop's measurement window while it runs: when it ends (monotonic seconds), and ``close`` to end it
    now (a precision rule that has seen enough): the requests still streaming are cut there, as at its end."""

    def __init__(self, t0: float, end: float) -> None:
        self.t0, self.end = t0, end
        self.closed_at: float | None = None  # seconds since t0 where ``close`` ended it
        self.workers: list[asyncio.Task] = []

    def close(self) -> None:
        now = time.monotonic()
        if self.closed_at is None and now < self.end:
            self.end, self.closed_at = now, now - self.t0
            for task in self.workers:
                task.cancel()


async def closed_loop(
    base_url: str,
    model: str,
    make_prompt: Callable[[int], PromptLike],
    concurrency: int,
    duration_s: float,
    opts: RequestOptions,
    progress: Callable[[str], None] | None = None,
    watch: Callable[[Window, list[RequestRecord]], Awaitable[None]] | None = None,
) -> tuple[Window, list[RequestRecord]]:
    """Sustained decode: ``concurrency`` requests in flight for ``duration_s``; a finished request is replaced at
    once. ``watch`` (the window and its records so far) runs beside it and may end it early (``Window.close``).
    Returns (the window, records); the window lasted ``window.end - window.t0``."""
    records: list[RequestRecord] = []
    counter = iter(range(10**9))
    async with session_for(concurrency) as session:
        t0 = time.monotonic()
        window = Window(t0, t0 + duration_s)

        async def worker(w: int) -> None:
            while time.monotonic() < window.end:
                i = next(counter)
                prompt, n, tags = await _resolve(make_prompt, i)
                rec = RequestRecord(index=i, worker=w, prompt_tokens=n, start=time.monotonic() - t0, **tags)
                records.append(rec)
                await stream_completion(session, base_url, model, prompt, opts, rec, t0, window.end)
                if rec.error and not rec.cut_at_window_end:
                    # do not hammer a failing server: a failed request ends this worker
                    return

        async def report() -> None:
            while True:
                await asyncio.sleep(max(1.0, duration_s / 10))
                if progress:
                    toks = sum(r.output_tokens for r in records)
                    progress(f"t={time.monotonic() - t0:.1f}s requests={len(records)} output_tokens={toks}")

        window.workers = [asyncio.create_task(worker(w)) for w in range(concurrency)]
        helpers = [asyncio.create_task(report())]
        if watch is not None:
            helpers.append(asyncio.create_task(watch(window, records)))
        try:
            await asyncio.wait(window.workers)
        finally:
            for task in (*window.workers, *helpers):
                task.cancel()
            await asyncio.gather(*window.workers, *helpers, return_exceptions=True)
        for task in window.workers:  # a worker's own failure (not the window's close) is the loop's
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()
        if window.closed_at is not None:  # requests in flight when the rule closed the window were cut there
            for rec in records:
                if rec.finish_reason is None and rec.error is None:
                    rec.cut_at_window_end = True
    return window, records


async def fixed_count(
    base_url: str,
    model: str,
    make_prompt: Callable[[int], PromptLike],
    requests: int,
    concurrency: int,
    opts: RequestOptions,
    phase: str = "",
    first_index: int = 0,
) -> tuple[float, list[RequestRecord]]:
    """A fixed number of requests, at most ``concurrency`` in flight (capacity and prefix-cache cells).

    Returns (wall seconds from the first send to the last end, records).
    """
    records: list[RequestRecord] = []
    queue = iter(range(first_index, first_index + requests))
    async with session_for(concurrency) as session:
        t0 = time.monotonic()

        async def worker(w: int) -> None:
            for i in queue:
                prompt, n, tags = await _resolve(make_prompt, i)
                rec = RequestRecord(index=i, worker=w, prompt_tokens=n, start=time.monotonic() - t0,
                                    phase=phase, **tags)
                records.append(rec)
                await stream_completion(session, base_url, model, prompt, opts, rec, t0)

        await asyncio.gather(*(worker(w) for w in range(min(concurrency, requests))))
        wall = time.monotonic() - t0
    records.sort(key=lambda r: r.index)
    return wall, records


async def sequential(
    base_url: str,
    model: str,
    prompts: list[PromptLike],
    opts: RequestOptions,
) -> list[RequestRecord]:
    """One request at a time (prefill and latency cells)."""
    out = []
    async with session_for(1) as session:
        for i, p in enumerate(prompts):
            prompt, n, tags = _unpack(p)
            t0 = time.monotonic()
            rec = RequestRecord(index=i, worker=0, prompt_tokens=n, start=0.0, **tags)
            await stream_completion(session, base_url, model, prompt, opts, rec, t0)
            out.append(rec)
    return out


class Pacer:
    """An open loop's clock: a thread of its own waits for each send time of a schedule and hands the event loop
    the request's index at that moment (``call_soon_threadsafe`` wakes the loop at once); ``due()`` awaits the
    next. The loop's own timers wait whole milliseconds (epoll's timeout is rounded up to one), so a request paced
    by them leaves up to a millisecond late; the thread's wait has the clock's precision (tens of microseconds).
    Indices due while the loop is busy wait in order; each request's lag is still its own (actual - scheduled)."""

    def __init__(self, t0: float, schedule: list[float]) -> None:
        self._t0, self._schedule = t0, schedule
        self._queue: asyncio.Queue[int] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="speedmatrix-pacer", daemon=True)

    def _run(self) -> None:
        for i, at in enumerate(self._schedule):
            wait = self._t0 + at - time.monotonic()
            if wait > 0 and self._stop.wait(wait):
                return
            try:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, i)
            except RuntimeError:  # the loop has closed
                return

    async def due(self) -> int:
        return await self._queue.get()

    def __enter__(self) -> Pacer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()


async def open_loop(
    base_url: str,
    model: str,
    prompts: list[PromptLike],
    schedule: list[float],
    opts: RequestOptions,
    counted: Callable[[float], bool] = lambda _t: True,
    progress: Callable[[str], None] | None = None,
) -> tuple[float, list[RequestRecord]]:
    """Open-loop arrivals: request i is sent at ``t0 + schedule[i]`` whether or not earlier ones have ended (no
    cap on requests in flight); each runs to its end. Every record keeps its scheduled and actual send time
    (the lag is the client's: a late wake-up of this process, never a wait for the server). Returns (t0,
    records in send order)."""
    records: list[RequestRecord] = []
    tasks: list[asyncio.Task] = []
    async with session_for(None) as session:
        t0 = time.monotonic()
        last_report = 0.0
        with Pacer(t0, schedule) as pacer:
            for _ in schedule:
                i = await pacer.due()
                at = schedule[i]
                prompt, n, tags = _unpack(prompts[i])
                rec = RequestRecord(index=i, worker=0, prompt_tokens=n, start=time.monotonic() - t0, **tags,
                                    scheduled=at, counted=counted(at), phase="" if counted(at) else "warmup")
                records.append(rec)
                tasks.append(asyncio.create_task(stream_completion(session, base_url, model, prompt, opts, rec, t0)))
                if progress and rec.start - last_report >= 1.0:
                    last_report = rec.start
                    done = sum(1 for t in tasks if t.done())
                    progress(f"t={rec.start:.1f}s sent={len(records)} ended={done} "
                             f"lag={1000 * (rec.start - at):.1f}ms")
        await asyncio.gather(*tasks)
    return t0, records
