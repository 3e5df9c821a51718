#!/usr/bin/env python3
"""A recording proxy for comparing benchmark clients: what does each client actually send?

Listens on --port, forwards every request to --upstream unchanged, streams the
answer back, and appends one JSON line per request to --out: method, path, the
request's JSON body with the prompt replaced by its type and length (token ids
are counted, text is measured in characters), and the headers minus
Authorization. It is a measuring aid for request *shapes*, not for timings (it
adds a hop).

    python bench/request_capture.py --upstream http://127.0.0.1:8000 --port 8999 --out shapes.jsonl
    # point a client at http://127.0.0.1:8999, then:
    python bench/request_capture.py --summarize shapes.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from aiohttp import ClientSession, ClientTimeout, web

HOP = {"host", "content-length", "transfer-encoding", "connection", "authorization"}


def shape(body: object) -> object:
    """The body with prompts and messages reduced to what they are (type and size)."""
    if not isinstance(body, dict):
        return body
    out = dict(body)
    prompt = out.get("prompt")
    if isinstance(prompt, str):
        out["prompt"] = f"<text: {len(prompt)} chars>"
    elif isinstance(prompt, list):
        if prompt and isinstance(prompt[0], int):
            out["prompt"] = f"<token ids: {len(prompt)}>"
        else:
            out["prompt"] = f"<list of {len(prompt)} prompts>"
    if isinstance(out.get("messages"), list):
        chars = sum(len(str(m.get("content", ""))) for m in out["messages"] if isinstance(m, dict))
        out["messages"] = f"<{len(out['messages'])} messages: {chars} chars>"
    return out


def last_usage(tail: bytes) -> dict | None:
    """The last non-null "usage" object in the end of a response (streamed events or one JSON body)."""
    found = None
    for line in tail.decode(errors="replace").splitlines():
        text = line.removeprefix("data:").strip()
        if '"usage"' not in text:
            continue
        try:
            usage = json.loads(text).get("usage")
        except ValueError:
            continue
        found = usage or found
    return found


def serve(ns: argparse.Namespace) -> None:
    out = Path(ns.out)

    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = f"<{len(raw)} bytes, not JSON>"
        record = {"client": ns.client, "method": request.method, "path": request.path_qs, "body": shape(body),
                  "headers": {k: v for k, v in request.headers.items() if k.lower() not in HOP}}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP - {"authorization"}}
        async with request.app["session"].request(request.method, ns.upstream + request.path_qs, data=raw,
                                                  headers=headers) as up:
            resp = web.StreamResponse(status=up.status, headers={
                k: v for k, v in up.headers.items() if k.lower() not in HOP})
            await resp.prepare(request)
            tail = b""
            async for chunk in up.content.iter_any():
                tail = (tail + chunk)[-8192:]
                await resp.write(chunk)
        record["usage"] = last_usage(tail)
        with out.open("a") as f:
            f.write(json.dumps(record) + "\n")
        try:
            await resp.write_eof()
        except ConnectionError:  # the client hung up after the last chunk: nothing to tell it
            pass
        return resp

    async def start(app: web.Application) -> None:
        app["session"] = ClientSession(timeout=ClientTimeout(total=None))

    async def stop(app: web.Application) -> None:
        await app["session"].close()

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_route("*", "/{tail:.*}", handle)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    web.run_app(app, host="127.0.0.1", port=ns.port, print=None)


def summarize(path: str) -> None:
    """One line per client and path: the body keys and values that are the same in all its requests."""
    groups: dict[tuple[str, str], list[dict]] = {}
    records = [json.loads(line) for line in Path(path).read_text().splitlines()]
    for r in records:
        if isinstance(r["body"], dict):
            groups.setdefault((r["client"], r["path"]), []).append(r["body"])
        else:
            groups.setdefault((r["client"], r["path"]), [])
    for (client, p), bodies in sorted(groups.items()):
        print(f"## {client} {p}: {len(bodies)} requests with a JSON body")
        keys = sorted({k for b in bodies for k in b})
        for k in keys:
            vals = sorted({json.dumps(b.get(k), sort_keys=True) for b in bodies})
            shown = vals[0] if len(vals) == 1 else f"{len(vals)} values, e.g. {vals[0]} .. {vals[-1]}"
            print(f"  {k}: {shown}")
        usages = [r for r in records if (r["client"], r["path"]) == (client, p) and r.get("usage")]
        for field in ("prompt_tokens", "completion_tokens"):
            vals = sorted({u["usage"].get(field) for u in usages})
            if vals:
                print(f"  usage.{field}: {vals[0]}" + (f" .. {vals[-1]}" if len(vals) > 1 else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", help="the server to forward to, e.g. http://127.0.0.1:8000")
    ap.add_argument("--port", type=int, default=8999)
    ap.add_argument("--out", help="JSON lines file to append to")
    ap.add_argument("--client", default="?", help="a label written on every record (which client is pointed here)")
    ap.add_argument("--summarize", metavar="JSONL", help="print the captured request shapes per client and stop")
    ns = ap.parse_args()
    if ns.summarize:
        summarize(ns.summarize)
        return 0
    if not ns.upstream or not ns.out:
        ap.error("--upstream and --out are needed to record")
    serve(ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
