"""Blocking HTTP for one-off calls (a server's probes and warm-up, the quality gates, a registry's digest), over
the standard library's ``urllib``.

Two libraries speak HTTP in speedmatrix, each for what the other cannot do: a cell's streams and its
``/metrics`` scrapes run inside one event loop with many requests in flight (aiohttp: ``measure.client``,
``jobs.cells``); every other request is one call that waits for its answer, and goes through here.
An HTTP error status is an answer (a :class:`Response` with its status), not an exception; a network
failure (refused, timed out, no such host) raises ``OSError`` (``urllib.error.URLError`` is one).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from email.message import Message
from typing import Any


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    headers: Message = field(default_factory=Message)  # case-insensitive: headers.get("Docker-Content-Digest")

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.body)


def request(method: str, url: str, *, body: Any = None, data: bytes | None = None,
            headers: dict[str, str] | None = None, params: dict[str, str] | None = None,
            timeout: float = 5.0) -> Response:
    """One request; ``body`` is sent as JSON, ``data`` as it is. Redirects are followed."""
    if params:
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode(params)
    headers = dict(headers or {})
    if body is not None:
        data = json.dumps(body).encode()
        headers.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Response(resp.status, resp.read(), resp.headers)
    except urllib.error.HTTPError as exc:  # an answer with an error status
        with exc:
            return Response(exc.code, exc.read() or b"", exc.headers)


def get(url: str, headers: dict[str, str] | None = None, timeout: float = 5.0, **kw: Any) -> Response:
    return request("GET", url, headers=headers, timeout=timeout, **kw)


def post_json(url: str, body: Any, headers: dict[str, str] | None = None, timeout: float = 5.0) -> Response:
    return request("POST", url, body=body, headers=headers, timeout=timeout)
