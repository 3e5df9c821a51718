"""A test fixture, not a vLLM: a tiny OpenAI-style streaming server that misbehaves on request.

The model name picks the behaviour: ``ok``, ``stall`` (stops sending after 3
tokens), ``malformed`` (a broken event), ``drop`` (closes the connection mid
stream), ``http500``, ``multi`` (two tokens an event, the count only in the final usage
event), ``loop`` (a sentence repeated without end), ``json`` (a JSON answer instead of a
stream), ``special`` (every token a special one, as random weights can make a model emit:
the text is ``<pad>`` if the request says ``skip_special_tokens: false``, else empty, as
vLLM streams it). Used to check that the client ends every request with a
recorded reason instead of hanging.

``/tokenize`` answers one id per character (after a BOS, as vLLM's adds the
model's special tokens) and ``/detokenize`` turns them back (enough to size
prompts). Without
``running`` there is no ``/metrics`` (like any OpenAI-compatible server that is
not vLLM); with ``app(running=N)`` ``/metrics`` reports N requests running
that are not the client's (a busy server).
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

PROMPTS = web.AppKey("prompts", list)
BODIES = web.AppKey("bodies", list)


def _chunk(text: str, n: int, token_ids: bool = False) -> bytes:
    """One token's event; with ``token_ids`` (the request asked: return_token_ids) its id too, as vLLM sends it."""
    body = {"choices": [{"index": 0, "text": text, "finish_reason": None,
                         **({"token_ids": [ord(text) % 256]} if token_ids else {})}],
            "usage": {"prompt_tokens": 4, "completion_tokens": n}}
    return f"data: {json.dumps(body)}\n\n".encode()


async def completions(request: web.Request) -> web.StreamResponse:
    payload = await request.json()
    request.app[PROMPTS].append(payload["prompt"])
    request.app[BODIES].append(payload)
    mode = payload["model"]
    if mode == "http500":
        return web.Response(status=500, text="boom")
    if mode == "json":  # a whole answer as JSON, not a stream
        return web.json_response({"choices": [{"index": 0, "text": "x" * 8, "finish_reason": "length"}]})
    if mode == "multi":
        return await multi_token_events(request, payload)
    if mode == "loop":
        return await looping_events(request, payload)
    if mode == "special":
        return await special_token_events(request, payload)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(1, payload.get("max_tokens", 8) + 1):
        if mode == "stall" and i > 3:
            await asyncio.sleep(3600)
        if mode == "malformed" and i == 3:
            await resp.write(b"data: {not json\n\n")
            continue
        if mode == "drop" and i == 3:
            request.transport.close()
            return resp
        await resp.write(_chunk("x", i, bool(payload.get("return_token_ids"))))
        await asyncio.sleep(0.005)
    done = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 4, "completion_tokens": payload.get("max_tokens", 8)}}
    await resp.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
    return resp


async def multi_token_events(request: web.Request, payload: dict) -> web.StreamResponse:
    """Two tokens an event and no usage in the events (as vLLM streams speculative decoding without
    continuous usage stats), then the final usage-only event and [DONE]."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    n = payload.get("max_tokens", 8)
    for i in range(n // 2):
        reason = "length" if i == n // 2 - 1 else None
        body = {"choices": [{"index": 0, "text": "ab", "finish_reason": reason}]}
        await resp.write(f"data: {json.dumps(body)}\n\n".encode())
    usage = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": n}}
    await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
    return resp


async def special_token_events(request: web.Request, payload: dict) -> web.StreamResponse:
    """Every token a special one, in vLLM's event shapes: its text ``<pad>`` if the request keeps special
    tokens (``skip_special_tokens: false``), else empty; usage in each event only if asked
    (``continuous_usage_stats``), the final usage event if asked (``include_usage``)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    n = payload.get("max_tokens", 8)
    text = "" if payload.get("skip_special_tokens", True) else "<pad>"
    options = payload.get("stream_options") or {}
    head = {"id": "cmpl-special", "object": "text_completion", "model": "special"}
    for i in range(1, n + 1):
        body = {**head, "choices": [{"index": 0, "text": text, "finish_reason": "length" if i == n else None}]}
        if options.get("continuous_usage_stats"):
            body["usage"] = {"prompt_tokens": 4, "completion_tokens": i, "total_tokens": 4 + i}
        await resp.write(f"data: {json.dumps(body)}\n\n".encode())
        await asyncio.sleep(0.005)
    if options.get("include_usage"):
        usage = {**head, "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}}
        await resp.write(f"data: {json.dumps(usage)}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def looping_events(request: web.Request, payload: dict) -> web.StreamResponse:
    """Some prose, then the same sentence over and over (one token an event), without pause."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    pieces = (["Once ", "upon ", "a ", "time ", "there ", "was ", "a ", "server. "]
              + ["and it ", "said ", "again "] * 100_000)
    for i in range(payload.get("max_tokens", 8)):
        body = {"choices": [{"index": 0, "text": pieces[i], "finish_reason": None}],
                "usage": {"prompt_tokens": 4, "completion_tokens": i + 1}}
        await resp.write(f"data: {json.dumps(body)}\n\n".encode())
        if i % 64 == 0:
            await asyncio.sleep(0)
    await resp.write(b"data: [DONE]\n\n")
    return resp


TOKENIZE = web.AppKey("tokenize", str)


async def tokenize(request: web.Request) -> web.Response:
    """One id per character, after a BOS (id 2) unless add_special_tokens is false, like vLLM's.
    ``app(tokenize_answer="html")`` answers an HTML page instead, ``"nofield"`` JSON without ``tokens``."""
    if request.app[TOKENIZE] == "html":
        return web.Response(text="<html>a proxy's login page</html>", content_type="text/html")
    if request.app[TOKENIZE] == "nofield":
        return web.json_response({"count": 3})
    payload = await request.json()
    bos = [2] if payload.get("add_special_tokens", True) else []
    return web.json_response({"tokens": bos + [ord(ch) % 256 for ch in payload["prompt"]]})


async def detokenize(request: web.Request) -> web.Response:
    payload = await request.json()
    return web.json_response({"prompt": "".join(chr(t) for t in payload["tokens"])})


async def health(request: web.Request) -> web.Response:
    return web.Response()


def metrics_handler(running: int):
    async def handler(request: web.Request) -> web.Response:
        text = ("# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="ok"}} {running}.0\n'
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
                "# TYPE vllm:num_requests_waiting gauge\n"
                'vllm:num_requests_waiting{model_name="ok"} 0.0\n')
        return web.Response(text=text, content_type="text/plain")
    return handler


async def models(_request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "ok", "object": "model"}]})


def app(running: int | None = None, tokenize_answer: str = "ok") -> web.Application:
    a = web.Application()
    a[PROMPTS] = []  # every prompt received, for the tests to look at
    a[BODIES] = []  # every request's body
    a[TOKENIZE] = tokenize_answer
    a.router.add_post("/v1/completions", completions)
    a.router.add_get("/health", health)  # GuideLLM checks it before it starts
    a.router.add_get("/v1/models", models)  # the broker's warm-up asks the model's name
    a.router.add_post("/tokenize", tokenize)
    a.router.add_post("/detokenize", detokenize)
    if running is not None:
        a.router.add_get("/metrics", metrics_handler(running))
    return a
