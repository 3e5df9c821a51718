"""Process utilities the server lifecycle shares: who owns a run's servers, process groups, ports,
HTTP probes (where its state files are and its locks: ``state``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path

from ..core import http
from .state import device_scope

POLL_S = 0.5


STOP_GRACE_S = 15.0


OWNER_ENV = "SPEEDMATRIX_OWNER"


def owner_token() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


OWNER_SCOPE_ENV = "SPEEDMATRIX_OWNER_SCOPE"


def claim_ownership(main_process: bool) -> None:
    """Make this process the owner of the servers its jobs start.

    The workflow's main process always claims. On a cluster, the Snakemake
    process that runs a group job inside an allocation claims too (its scope,
    host plus allocation, differs from the inherited one); the per-job
    Snakemake processes it starts inside the same allocation do not, so a
    server lives as long as the group, not as long as one cell's step.
    """
    if main_process or os.environ.get(OWNER_SCOPE_ENV) != device_scope():
        os.environ[OWNER_ENV] = owner_token()
        os.environ[OWNER_SCOPE_ENV] = device_scope()


def owner_alive(token: str | None) -> bool:
    if not token:
        return True
    host, _, pid = token.rpartition(":")
    if host != socket.gethostname():
        return True  # another host's process: cannot be watched from here
    try:
        return pid_alive(int(pid))  # a killed owner its parent has not reaped yet (a zombie) is gone
    except ValueError:
        return True


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child counts as gone
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # only zombies left counts as gone
    return bool(group_members(pgid))


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of a process group, from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().split(")")[-1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def end_group(pgid: int, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM a process group, then SIGKILL whatever is left after ``grace_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.1)


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a GET to a server, with its key; an HTTP error is its status and no body; a network
    failure raises ``OSError``."""
    return _answer(http.get(url, _auth(), timeout))


def http_post_json(url: str, body: dict, timeout: float = 5.0) -> tuple[int, bytes]:
    return _answer(http.post_json(url, body, _auth(), timeout))


def _answer(resp: http.Response) -> tuple[int, bytes]:
    return resp.status, resp.body if resp.status < 400 else b""


def _auth() -> dict[str, str]:
    from ..measure.client import auth_headers

    return auth_headers()
