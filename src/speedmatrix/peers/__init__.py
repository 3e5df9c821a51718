"""Independent benchmark clients ("peers") that measure the same load as speedmatrix, for the reference rule.

One interface, a table of implementations: a peer turns a `Load` into an argv
list (run in its own process, with its own Python environment) and reads its
own output back into the shared fields of `FIELDS`. Adding a client is a new
module here and a line in `table()`.

Where a client's figures mean something else than ours, the peer says so in
`notes` (what counts as a token, which inter-token figure it reports); the
report and docs/fidelity.md print them beside the table.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .base import COMPARED, FIELDS, OURS, Load, Peer

__all__ = ["COMPARED", "FIELDS", "OURS", "Load", "Peer", "differences", "normalized", "problems",
           "python_for", "run", "summarize", "table"]


def table() -> dict[str, Peer]:
    from .aiperf import AIPerf
    from .guidellm import GuideLLM
    from .vllm_bench import VllmBenchServe

    return {p.name: p for p in (VllmBenchServe(), AIPerf(), GuideLLM())}


def peers_dir() -> Path:
    """Where `make peers` puts the clients' venvs: ``SPEEDMATRIX_PEERS_DIR``, else ``.peers`` in the current
    directory (the workflow runs from its own directory, where the Makefile builds them)."""
    return Path(os.environ.get("SPEEDMATRIX_PEERS_DIR") or ".peers")


def python_for(name: str, settings: dict[str, Any]) -> list[str]:
    """The command that runs a peer's Python: `reference.python.<name>` of the experiment (an argv list or one
    path), else the venv `make peers` builds (<peers_dir>/<name>/bin/python), else this Python (the client
    installed beside the workflow)."""
    given = (settings.get("python") or {}).get(name)
    if given:
        return [given] if isinstance(given, str) else list(given)
    venv = (peers_dir() / name / "bin" / "python").absolute()
    if venv.exists():
        return [str(venv)]
    return [sys.executable]


def problems(names: list[str], settings: dict[str, Any], where: str) -> list[str]:
    """What keeps a named client from running: unknown, or not importable by its Python. One line each."""
    known, out = table(), []
    for name in names:
        if name not in known:
            out.append(f"{where}: key 'reference.clients': unknown client {name!r}; known: "
                       f"{', '.join(sorted(known))}")
            continue
        peer = known[name]
        cmd = [*python_for(name, settings), "-c", f"import {peer.module}"]
        try:
            ok = subprocess.run(cmd, capture_output=True, timeout=300).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if not ok:
            out.append(f"{where}: key 'reference.clients': {name} cannot be imported by {cmd[0]}: run `make peers` "
                       f"(installs {peer.pin} into .peers/{name}), or name its Python under "
                       f"'reference.python.{name}'")
    return out


def run(peer: Peer, load: Load, python: list[str], work: Path, api_key: str | None = None) -> dict[str, Any]:
    """Run one peer once; its fields, plus the process's wall time and CPU seconds (its children included)."""
    work.mkdir(parents=True, exist_ok=True)
    env = peer.env(dict(os.environ), load, api_key)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(peer.argv(python, load, work, api_key), capture_output=True, text=True, env=env, cwd=work)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-2000:]
        if api_key:
            tail = tail.replace(api_key, "***")
        raise RuntimeError(f"{peer.name} failed ({proc.returncode}): {tail}")
    result = {k: None for k in FIELDS}
    result.update(peer.parse(work))
    result["process_wall_s"] = round(wall, 3)
    result["client_cpu_s"] = round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 3)
    return result


# ---- agreement: medians, spreads, differences --------------------------------------------------

def _values(rounds: list[dict[str, Any]], key: str) -> list[float]:
    """A figure of each round that counts: a round with an error (a failed client, or one that completed fewer
    requests than asked) keeps its figures in the document but stays out of medians and spreads."""
    return [r[key] for r in rounds if r.get(key) is not None and not r.get("error")]


def _median(rounds: list[dict[str, Any]], key: str) -> float | None:
    vals = _values(rounds, key)
    return statistics.median(vals) if vals else None


def _spread(rounds: list[dict[str, Any]], key: str) -> list[float] | None:
    vals = _values(rounds, key)
    return [min(vals), max(vals)] if vals else None


def differences(med: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Each other client's medians against speedmatrix's, in percent (client against ours)."""
    out = {}
    for who in med:
        if who == OURS:
            continue
        out[who] = {}
        for k in COMPARED:
            a, b = med[OURS].get(k), med[who].get(k)
            out[who][k] = None if a in (None, 0) or b is None else round(100.0 * (b / a - 1), 2)
    return out


def summarize(runs: dict[str, list[dict[str, Any]]], med: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Medians (or the given ones), spreads and differences from speedmatrix's medians."""
    keys = (*FIELDS, "client_cpu_s", "process_wall_s")
    med = med or {who: {k: _median(rs, k) for k in keys} for who, rs in runs.items()}
    spread = {who: {k: _spread(rs, k) for k in COMPARED} for who, rs in runs.items()}
    return {"medians": med, "spread": spread, "difference_pct": differences(med)}


def normalized(doc: dict[str, Any]) -> dict[str, Any]:
    """A reference JSON in the current shape. Those written before AIPerf and GuideLLM joined had one peer,
    vllm bench serve, its rounds under its own key and the difference the other way round (ours against
    it): their medians are kept and the difference is taken again, client against ours."""
    if "clients" in doc:
        return doc
    clients = [OURS, "vllm_bench_serve"]
    runs = {who: doc.get(who) or [] for who in clients}
    return {**doc, "clients": clients, "runs": runs, **summarize(runs, doc.get("medians")), "notes": {}}
