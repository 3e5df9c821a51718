"""The broker's warm-up: before a server is declared up it gets one short greedy and one short sampled completion
(what a server compiles on its first sampled batch is not the first cell's to pay); a server that refuses them
still starts, with the reason recorded."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestServer

from fault_server import BODIES, app
from speedmatrix.serve import broker, procs


def test_warm_up_sends_a_greedy_and_a_sampled_request():
    async def go():
        a = app()
        async with TestServer(a) as srv:
            url = str(srv.make_url("")).rstrip("/")
            listing = (await asyncio.to_thread(procs.http_get, f"{url}/v1/models"))[1]
            got = await asyncio.to_thread(broker.warm_up, url, broker.served_model(listing))
        return got, a[BODIES]

    got, bodies = asyncio.run(go())
    assert got["status_codes"] == [200, 200] and "error" not in got
    assert [b["temperature"] for b in bodies] == [0.0, 0.7]
    assert bodies[1]["top_p"] == 0.95
    # nothing a cell does not ask (vLLM 0.32 for the CPU with an MTP drafter dies on a top_k)
    assert all(set(b) <= {"model", "prompt", "max_tokens", "temperature", "top_p"} for b in bodies)
    assert all(b["model"] == "ok" and b["max_tokens"] == 4 and not b.get("stream") for b in bodies)


def test_warm_up_failure_is_recorded_not_raised():
    got = broker.warm_up("http://127.0.0.1:9", "ok")  # nothing listens there
    assert "error" in got and "status_codes" not in got and got["seconds"] >= 0
