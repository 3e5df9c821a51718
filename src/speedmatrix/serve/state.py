"""Where the server lifecycle keeps its state, and its locks: every path under a results root's ``.devices/``
and a server config's state folder is named here, and every lock is taken through :func:`flocked`
(docs/architecture.md, "The server lifecycle's state files").
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

# a server config's state folder (results/<experiment>/servers/<id>/)
LAUNCH = "launch.json"
STARTING = "broker.starting.json"
RUNNING = "broker.json"
STARTUP = "startup.json"
STARTS = "starts.jsonl"
STARTUP_ERROR = "startup-error.json"
SERVER_LOG = "server.log"
BROKER_LOG = "broker.log"
LEASE = "lease"


def device_scope() -> str:
    """The devices a cell measures on: this host, or this host within one SLURM allocation.

    Cells in one scope are serialized and share one server at a time; other
    scopes (another node, another allocation) run in parallel.
    """
    scope = socket.gethostname()
    if os.environ.get("SLURM_JOB_ID"):
        scope += f"-slurm{os.environ['SLURM_JOB_ID']}"
    return scope


def devices(results_root: Path) -> Path:
    """The folder of the host's locks and measuring records, shared by every experiment under the root."""
    return results_root / ".devices"


def device_lock_file(results_root: Path) -> Path:
    """One cell at a time finds or starts a server in this scope."""
    return devices(results_root) / f"{device_scope()}.lock"


def measure_lock_file(results_root: Path) -> Path:
    """Who may measure at the same time: shared beside others, exclusive alone."""
    return devices(results_root) / f"{device_scope()}.measure.lock"


def measuring_dir(results_root: Path) -> Path:
    """One file per cell measuring now."""
    return devices(results_root) / f"{device_scope()}.measuring"


def measured_journal(results_root: Path) -> Path:
    """A line per finished measurement: who measured when (the matrix's ``ran_beside``)."""
    return devices(results_root) / f"{device_scope()}.measured.jsonl"


@contextlib.contextmanager
def flocked(path: Path, shared: bool = False) -> Iterator[None]:
    """Hold an ``flock`` on ``path`` (created with its folder if missing) until the block ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def lease_held(state: Path) -> bool:
    """A cell holds the server while it measures (a shared ``flock`` on ``lease``)."""
    try:
        with open(state / LEASE, "rb") as fh:
            # cells hold a shared lock while they measure: an exclusive try fails then
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fh, fcntl.LOCK_UN)
            return False
    except BlockingIOError:
        return True
    except FileNotFoundError:
        return False
