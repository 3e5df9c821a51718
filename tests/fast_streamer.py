"""A test fixture, not a model server: streams OpenAI-style completion events as fast as it can.

bench/client_overhead.py, bench/client_capacity.py and bench/loop_cost.py run it to measure a client.

``POST /v1/completions`` answers a stream of ``max_tokens`` events, one token
each, in the shape vLLM sends (a ``choices`` entry with the text, and usage
with the running ``completion_tokens``), then ``[DONE]``. Events are prebuilt
and written in batches, so the streamer costs little per token and the client
under test is the bottleneck.

Injected delays, for timing error: ``--ttft-ms`` holds the first event back
that long, and ``--gap-ms`` spaces the events on a fixed schedule (one event
per write then).

    python tests/fast_streamer.py PORT [--ttft-ms MS] [--gap-ms MS] [--text words|loop]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random

from aiohttp import web

BATCH = 64
DELAYS = {"ttft_ms": 0.0, "gap_ms": 0.0}
# each event's text: a word drawn from a fixed seed (text that does not loop), or the same word
WORDS = ("the of and to in is was for on that with as by at from his her it an be this which or are had not but "
         "what all were when we there can more if no out so said one about up them some could into time only new "
         "two may first then do any like my now over such our man me even most made after also did many before "
         "must through back years where much your way well down should because each just those people how too "
         "little state good very make world still own see men work long get here between both life being under "
         "never day same another know while last might us great old year off come since against go came right used "
         "take three").split()
TEXT = {"mode": "words"}
_EVENTS: dict[bool, list[bytes]] = {True: [], False: []}


def _data(body: dict) -> bytes:
    return f"data: {json.dumps(body)}\n\n".encode()


def _usage(n: int) -> dict:
    return {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n}


def events(n: int, continuous_usage: bool) -> list[bytes]:
    """One event per token; with usage in each (vLLM's ``continuous_usage_stats``) or not."""
    evs = _EVENTS[continuous_usage]
    rng = random.Random(len(evs))
    while len(evs) < n:
        word = " " + rng.choice(WORDS) if TEXT["mode"] == "words" else " tok"
        body = {"id": "cmpl-bench", "object": "text_completion", "model": "bench",
                "choices": [{"index": 0, "text": word, "logprobs": None, "finish_reason": None}]}
        if continuous_usage:
            body["usage"] = _usage(len(evs) + 1)
        evs.append(_data(body))
    return evs[:n]


def _final(n: int) -> bytes:
    """As vLLM ends a stream: the finish reason, then a usage-only event (include_usage), then [DONE]."""
    finish = {"id": "cmpl-bench", "object": "text_completion", "model": "bench",
              "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]}
    usage = {"id": "cmpl-bench", "object": "text_completion", "model": "bench", "choices": [], "usage": _usage(n)}
    return _data(finish) + _data(usage) + b"data: [DONE]\n\n"


async def completions(request: web.Request) -> web.StreamResponse:
    payload = await request.json()
    n = int(payload.get("max_tokens", 16))
    ttft_ms, gap_ms = DELAYS["ttft_ms"], DELAYS["gap_ms"]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    evs = events(n, bool((payload.get("stream_options") or {}).get("continuous_usage_stats")))
    if ttft_ms:
        await asyncio.sleep(ttft_ms / 1000)
    if gap_ms:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for k, ev in enumerate(evs):
            # on a schedule (no drift): event k at t0 + k * gap
            await asyncio.sleep(max(0.0, t0 + k * gap_ms / 1000 - loop.time()))
            await resp.write(ev)
    else:
        for k in range(0, n, BATCH):
            await resp.write(b"".join(evs[k:k + BATCH]))
    await resp.write(_final(n))
    return resp


async def models(_request: web.Request) -> web.Response:
    """The model list a client may ask for first (GuideLLM checks its backend this way)."""
    return web.json_response({"object": "list", "data": [{"id": "bench", "object": "model", "owned_by": "bench"}]})


async def health(_request: web.Request) -> web.Response:
    return web.Response()


def app() -> web.Application:
    a = web.Application()
    a.router.add_post("/v1/completions", completions)
    a.router.add_get("/v1/models", models)
    a.router.add_get("/health", health)
    return a


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--ttft-ms", type=float, default=0.0)
    ap.add_argument("--gap-ms", type=float, default=0.0)
    ap.add_argument("--text", choices=["words", "loop"], default="words",
                    help="event text: seeded words (no loop) or the same word every event (a loop)")
    ns = ap.parse_args()
    DELAYS.update(ttft_ms=ns.ttft_ms, gap_ms=ns.gap_ms)
    TEXT["mode"] = ns.text
    web.run_app(app(), host="127.0.0.1", port=ns.port, print=None, access_log=None)
