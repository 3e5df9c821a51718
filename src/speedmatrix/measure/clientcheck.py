"""The client check: whether the client, not the server, set a measurement's figures.

Every cell's measurement runs inside a :class:`ClientCheck`. While it runs, a
task asks the event loop to wake it every ``TICK_S`` and keeps how much later
than asked it woke (the loop's *lag*): while the loop is held, by the client's
own work (parsing, building prompts, a busy callback) or by a machine whose
cores are taken by other processes (the server's threads on a CPU host), no
stream is read and no request is sent, so tokens are stamped and requests leave
late by about that much. Beside it, the client process's CPU seconds over the
window's wall seconds (its share of one core: the event loop is one thread), and
on Linux the share of the window its event loop's thread waited on a run queue,
ready to run while the cores ran other processes (``schedstat``), and the share
of all the machine's cores busy (``/proc/stat``). They say whose the lag was: a
client near a full core did it itself; a client waiting for a core was kept
waiting by the others.

A request's own time inside the client, from when it was due to when its bytes
left (``client.RequestRecord.sent``), is a column of the requests table.

:func:`verdict` turns the figures into the *Client-bound* status with its reason
where the lag or the CPU share passes the experiment's limits (``client:``
settings), whatever the kind of cell: such a figure measured the client.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

from .stats import percentile

TICK_S = 0.01  # a hundred wake-ups a second: a few hundredths of a percent of a core

# the figures a check adds to a measurement's, and the requests' time inside the client at p95 (each the worst
# over a cell's repeats: jobs.cells gives them to stats.combine)
FIGURES = ("client_loop_lag_p50_ms", "client_loop_lag_p95_ms", "client_loop_lag_max_ms", "client_cpu_share",
           "client_runqueue_share", "machine_busy_share", "client_wait_p95_ms")


def _runqueue_s() -> float | None:
    """Seconds the calling thread (the event loop's) has waited on a run queue, ready to run while the machine gave
    its cores to others (Linux schedstat), or None where the kernel does not say."""
    try:
        return int(Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def _machine_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of all the machine's cores since boot, or None where there is no /proc/stat."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    values = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    total = sum(values)
    return total - values[3] - values[4], total


class _Marks(NamedTuple):
    """The clocks a check reads at its start and at its end."""

    wall: float
    cpu: float
    machine: tuple[int, int] | None
    queued: float | None

    @classmethod
    def now(cls) -> _Marks:
        return cls(time.monotonic(), time.process_time(), _machine_ticks(), _runqueue_s())


def _share(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else round(part / whole, 4)


class ClientCheck:
    """One measurement's check (``async with ClientCheck() as check``): the event loop's lag while it runs, the
    clocks' differences from its start to its end; ``figures()`` after it. Lags are kept in milliseconds."""

    def __init__(self, tick_s: float = TICK_S) -> None:
        self.tick_s = tick_s
        self.lags_ms: list[float] = []
        self.wall_s = 0.0
        self._task: asyncio.Task | None = None
        self._start: _Marks | None = None
        self._end: _Marks | None = None

    async def _watch(self) -> None:
        lags, tick = self.lags_ms, self.tick_s
        while True:
            asked = time.monotonic()
            await asyncio.sleep(tick)
            lags.append(max(0.0, (time.monotonic() - asked - tick) * 1000))

    async def __aenter__(self) -> ClientCheck:
        self._start = _Marks.now()
        self._task = asyncio.get_running_loop().create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._task.cancel()
        self._end = _Marks.now()
        self.wall_s = self._end.wall - self._start.wall

    def figures(self, records: list | None = None) -> dict[str, Any]:
        """The measurement's figures; with its request records, their time inside the client at p95."""
        lags, a, b = self.lags_ms, self._start, self._end
        waits = [w * 1000 for w in (r.client_wait_s for r in records or ()) if w is not None]
        queued = None if a.queued is None or b.queued is None else b.queued - a.queued
        busy, total = ((b.machine[0] - a.machine[0], b.machine[1] - a.machine[1])
                       if a.machine is not None and b.machine is not None else (None, None))
        return {
            "client_loop_lag_p50_ms": _round(percentile(lags, 50)),
            "client_loop_lag_p95_ms": _round(percentile(lags, 95)),
            "client_loop_lag_max_ms": _round(max(lags) if lags else None),
            "client_cpu_share": _share(b.cpu - a.cpu, self.wall_s),
            "client_runqueue_share": _share(queued, self.wall_s),
            "machine_busy_share": _share(busy, total),
            "client_wait_p95_ms": _round(percentile(waits, 95)),
        }


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def verdict(figures: dict[str, Any], limits: Any, window_s: float | None) -> str | None:
    """Why the client set this measurement's figures, or None: the loop's lag p95 over
    ``limits.max_loop_lag_p95_ms``, its longest lag over ``limits.max_stall_share`` of the measured window
    ``window_s``, or the client's CPU share over ``limits.max_cpu_share``; each reason says whose the time was."""
    p95, longest = figures.get("client_loop_lag_p95_ms"), figures.get("client_loop_lag_max_ms")
    cpu, busy = figures.get("client_cpu_share"), figures.get("machine_busy_share")
    queued = figures.get("client_runqueue_share")
    reasons = []
    if p95 is not None and p95 > limits.max_loop_lag_p95_ms:
        reasons.append(f"its event loop ran late by {p95:.0f} ms at p95 (limit {limits.max_loop_lag_p95_ms:g} ms): "
                       "tokens were stamped and requests sent that late")
    if longest is not None and window_s and longest / 1000 > limits.max_stall_share * window_s:
        reasons.append(f"it stood still {longest / 1000:.1f} s of the {window_s:.1f} s measured (limit "
                       f"{limits.max_stall_share:.0%}): its streams were not read then")
    if cpu is not None and cpu > limits.max_cpu_share:
        reasons.append(f"its CPU share was over the limit of {limits.max_cpu_share:.0%} of a core")
    if not reasons:
        return None
    return "the client: " + "; ".join(reasons) + " (" + whose(cpu, queued, busy) + ")"


def whose(cpu: float | None, queued: float | None, busy: float | None) -> str:
    """Whose time it was: the client's own work (near a full core), or other processes on the machine's cores (the
    client ready to run and waiting for a core: Linux's run-queue wait; where the kernel does not say, a client that
    used little while the cores were busy)."""
    if cpu is None:
        return "the client's CPU time unknown"
    said = f"the client used {cpu:.0%} of a core"
    if queued is not None:
        said += f" and waited for one {queued:.0%} of the time"
    if busy is not None:
        said += f", the machine's cores {busy:.0%} busy"
    if cpu >= 0.8:
        return said + ": the client's own work"
    if (queued is not None and queued >= 0.2) or (queued is None and busy is not None and busy >= 0.8):
        return said + ": other processes held the cores"
    return said
