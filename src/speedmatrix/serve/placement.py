"""Where a server runs and who measures beside whom: GPU units of the node's pool for a new server
(``place``), the measure lock (cells that may share the node hold it shared, an isolated cell alone) and
the overlap journal (which other cells measured while one did: the matrix's ``ran_beside``).
The pool and each cell's placement are decided in speedmatrix.serve.pool.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..core import atomic
from . import state
from .broker import running_brokers, stop_broker
from .pool import Placement
from .procs import pid_alive


def held_units(info: dict, units: tuple[str, ...]) -> set[str]:
    """What a running server holds: its GPUs, or the whole device (a server started without a pool)."""
    held = info.get("gpus")
    return set(units) if not held else set(held) & set(units) or set(units)


def place(results_root: Path, state_dir: Path, placement: Placement, progress=print) -> list[str] | None:
    """Units for a new server of ``state_dir``'s config (called under the device lock): free ones
    first; then the units of idle servers of other configs, which are stopped; None when the rest are
    held by servers that are measuring (the caller waits)."""
    units = placement.units
    need = placement.need()
    others = [(d, i) for d, i in running_brokers(results_root, scope=state.device_scope()) if d != state_dir]
    held: dict[str, tuple[Path, dict]] = {}
    for d, i in others:
        for u in held_units(i, units):
            held[u] = (d, i)
    free = [u for u in units if u not in held]
    if len(free) < need:
        for d, i in others:
            if len(free) >= need:
                break
            if state.lease_held(d) or "startup" not in i:
                continue  # a cell is measuring on it (or will: it is still starting)
            what = ", ".join(sorted(held_units(i, units)))
            progress(f"stopping server {i.get('server_id')} (idle) to free {what}")
            stop_broker(d, i)
            free += [u for u in units if held.get(u, (None,))[0] == d]
    if len(free) < need:
        return None
    free = [u for u in units if u in free]  # in the pool's order
    return free[:need]


def measure_lock(results_root: Path, exclusive: bool) -> contextlib.AbstractContextManager[None]:
    """Cells that may run side by side hold it shared; an isolated cell holds it alone."""
    return state.flocked(state.measure_lock_file(results_root), shared=not exclusive)


@contextlib.contextmanager
def measuring(results_root: Path, experiment: str, server_id: str, label: str) -> Iterator[Callable[[], list]]:
    """Register this measurement on the host; yield a function that names every other measurement
    that overlapped it (running at its start or end, or one that ended during it)."""
    d = state.measuring_dir(results_root)
    d.mkdir(parents=True, exist_ok=True)
    journal = state.measured_journal(results_root)
    me = {"experiment": experiment, "server_id": server_id, "cell": label, "pid": os.getpid(),
          "start": time.time()}
    mine = d / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.json"

    def current() -> list[dict]:
        out = []
        for f in d.glob("*.json"):
            if f != mine:
                doc = atomic.read_json_if_there(f)
                if doc and pid_alive(int(doc.get("pid", 0))):
                    out.append(doc)
        return out

    at_start = current()
    atomic.write_json(mine, me)

    def beside() -> list[dict[str, Any]]:
        seen = at_start + current()
        with contextlib.suppress(FileNotFoundError):
            for line in journal.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    doc = json.loads(line)
                    if doc.get("end", 0) > me["start"]:
                        seen.append(doc)
        out, keys = [], set()
        for doc in seen:
            key = (doc.get("experiment"), doc.get("server_id"), doc.get("cell"))
            if key not in keys and doc.get("pid") != me["pid"]:
                keys.add(key)
                out.append({"experiment": key[0], "server_id": key[1], "cell": key[2]})
        return sorted(out, key=lambda x: (str(x["server_id"]), str(x["cell"])))

    try:
        yield beside
    finally:
        with contextlib.suppress(FileNotFoundError):
            mine.unlink()
        with open(journal, "a") as fh:
            fh.write(json.dumps({**me, "end": time.time()}) + "\n")
