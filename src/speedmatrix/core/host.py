"""The machine a result was measured on and the code that measured it: the CPU's model and count, which machine
and which boot of it (hashed ids), the git commit of the checkout the package runs from (None for an installed
copy), read once a process; and how fast one of its cores runs Python just now (``speed_probe``), measured when
asked."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

# the checkout the package runs from (src/speedmatrix/core -> the checkout; a wheel: the site-packages folder), named
# once for every module that reads a file of the repository (the locks, the commit)
CHECKOUT = Path(__file__).resolve().parents[3]


@functools.cache
def cpu_model() -> str | None:
    """The CPU's model name (Linux /proc/cpuinfo; elsewhere what ``platform`` says, or None)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


@functools.cache
def commit() -> str | None:
    """The commit of the checkout this package runs from, with "-dirty" when tracked files changed; None when it is
    not a git checkout (an installed wheel) or git is absent."""
    if not (CHECKOUT / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode:
            return None
        dirty = subprocess.run(["git", "-C", str(CHECKOUT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def _hashed(path: str) -> str | None:
    """The first 12 hex digits of the SHA-256 of a file's text (the id itself never leaves the host), or None."""
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return hashlib.sha256(text.encode()).hexdigest()[:12] if text else None


@functools.cache
def machine_id() -> str | None:
    """Which machine (its systemd machine id, hashed): two runs with different ids ran on two machines; the same id
    can still be two virtual machines made from one image."""
    return _hashed("/etc/machine-id") or _hashed("/var/lib/dbus/machine-id")


@functools.cache
def boot_id() -> str | None:
    """Which boot of the machine (the kernel's boot id, hashed): two runs with the same one ran on one host without
    a restart between them."""
    return _hashed("/proc/sys/kernel/random/boot_id")


def facts() -> dict:
    """What a result's provenance says of the machine and the code (``gpu`` facts come from the measure layer)."""
    return {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "machine_id": machine_id(), "boot_id": boot_id(),
            "speedmatrix_commit": commit()}


def _probe_work(n: int = 50_000) -> int:
    """A fixed piece of pure-Python work: small dict updates, string formatting and arithmetic, the kind of work a
    serving engine's scheduler and detokenizer do between model steps."""
    counts: dict[str, int] = {}
    acc = 0
    for i in range(n):
        key = f"r{i % 97}"
        counts[key] = counts.get(key, 0) + i
        acc += len(str(i)) + (i * 31) % 7
    return acc + len(counts)


def speed_probe(rounds: int = 9) -> dict:
    """How fast one core of this host runs Python just now: the fastest of ``rounds`` timings of ``_probe_work``
    (ms; less is faster) and their median. Taken before a server starts: a model small enough to be bound by the
    host's CPU side (a tiny model on a GPU) runs at this pace, so two runs whose probes differ compare hosts as
    well as software (``speedmatrix regress`` says so)."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        _probe_work()
        times.append((time.perf_counter() - t0) * 1000)
    return {"host_probe_ms": round(min(times), 3), "host_probe_median_ms": round(statistics.median(times), 3)}
