"""A test fixture, not a vLLM: a tiny OpenAI-style streaming server that misbehaves on request.

The model name picks the behaviour: ``ok``, ``stall`` (stops sending after 3
tokens), ``malformed`` (a broken event), ``drop`` (closes the connection mid
stream), ``http500``. Used to check that the client ends every request with a
recorded reason instead of hanging.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web


def _chunk(text: str, n: int) -> bytes:
    body = {"choices": [{"index": 0, "text": text, "finish_reason": None}],
            "usage": {"prompt_tokens": 4, "completion_tokens": n}}
    return f"data: {json.dumps(body)}\n\n".encode()


async def completions(request: web.Request) -> web.StreamResponse:
    payload = await request.json()
    mode = payload["model"]
    if mode == "http500":
        return web.Response(status=500, text="boom")
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
        await resp.write(_chunk("x", i))
        await asyncio.sleep(0.005)
    done = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 4, "completion_tokens": payload.get("max_tokens", 8)}}
    await resp.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
    return resp


def app() -> web.Application:
    a = web.Application()
    a.router.add_post("/v1/completions", completions)
    return a
