"""The results store: every run, one SQLite file under the results root (``<results>/history.sqlite``).

Four tables. ``runs``: one row a run, keyed by ``run_id`` (a hash of the experiment and of every cell's
measurement key and start time, so that the same run added twice adds nothing and a run resumed later, with more
cells, is a second run), with its manifest: experiment, status (complete / partial / failed, from the run
summary), start, the vLLM version and runtime pin (image digest or environment lock hash), model hashes, host (its
name, hashed machine and boot ids, and the median of the host probes taken before its server starts), CPU and GPU
model, driver, speedmatrix commit, and where it was read from. ``cells``: one row per cell per run, every
column of the matrix (lists and mappings as JSON text) plus ``config_sha256`` (the server config: its flags,
environment and models, not where or with what it ran) and ``basis_sha256`` (that and the cell and its client
settings: two cells with the same basis measured the same thing, so their figures can be compared). ``requests``:
each request's timing, for the regression verdict. ``tags``: a name for a run (``baseline``), moved by tagging
another run with it. Any SQLite client opens it (``sqlite3``, DuckDB, pandas).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from ..core import atomic, frames, runfolder
from ..core.errors import StoreError
from ..core.runfolder import RunFolder
from ..measure import records

SCHEMA_VERSION = 1
# per request: what the regression verdict resamples, and what says which requests count (declared with the table)
REQUEST_COLUMNS = list(records.STORED)
# a run's status that says some of its jobs failed or did not run (the others: complete; empty for a run that
# measured no cell; unknown for a folder kept without its run summary)
INCOMPLETE_STATUSES = ("partial", "failed")
RUN_COLUMNS = ["run_id", "experiment", "status", "cells", "started_at", "added_at", "vllm_version", "runtime_ref",
               "packages_sha256", "models_sha256", "hostname", "cpu_model", "cpu_count", "machine_id", "boot_id",
               "host_probe_ms", "gpu_name", "gpu_driver", "speedmatrix_commit", "speedmatrix_version", "jobs",
               "failed_jobs", "source"]


def path_for(results_root: str | Path) -> Path:
    """The store of a results root."""
    return runfolder.history(results_root)


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def server_flags(argv: list[str] | None, models: dict[str, Any] | None) -> list[str]:
    """A launch's server arguments as they define the config: what follows the model's folder (however the server
    was started: ``python -m vllm.entrypoints...``, ``vllm serve``, a container), without the host and port it
    happened to get, each model's folder written as the model's name (the folder differs by machine)."""
    argv = list(argv or [])
    names = list(models or {})
    first = next((i for i, a in enumerate(argv) if any(a.rstrip("/").endswith("/" + n) or a == n for n in names)),
                 None)
    if first is not None:
        argv = argv[first + 1:]
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--host", "--port"):
            skip = True
            continue
        for name in names:
            arg = re.sub(r"[^\s\"',]*/" + re.escape(name) + r"(?=[\"',\s]|$)", name, arg)
        out.append(arg)
    return out


def _env_of(argv: list[str] | None) -> list[str]:
    """The ``env NAME=value`` settings a launch put before the server's executable."""
    argv = list(argv or [])
    out = []
    for arg in argv[1:] if argv[:1] == ["env"] else []:
        if "=" not in arg or arg.startswith(("-", "/")):
            break
        out.append(arg)
    return out


def cell_identity(cell: dict[str, Any]) -> dict[str, str]:
    """A cell JSON's server config hash and measurement basis hash (see the module's doc)."""
    prov = cell.get("provenance") or {}
    models = {name: (m or {}).get("files") for name, m in (prov.get("models") or {}).items()}
    config = {"server": {k: v for k, v in (cell.get("server") or {}).items() if k != "server_id"},
              "flags": server_flags(prov.get("launch_argv"), prov.get("models")),
              "env": _env_of(prov.get("launch_argv")), "models": models}
    config_sha = _sha(config)
    spec = dict(cell.get("cell") or {})
    return {"config_sha256": config_sha,
            "basis_sha256": _sha({"config": config_sha, "cell": spec, "client": cell.get("client")}),
            "measurement_key": cell.get("measurement_key"),
            # the parts themselves: a setting an older run did not record yet is told apart from one that differs
            "cell_spec": json.dumps(spec, sort_keys=True, default=str),
            "client_settings": json.dumps(cell.get("client") or {}, sort_keys=True, default=str)}


def _cell_files(run: Path) -> list[Path]:
    return RunFolder(run).cell_files()


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str)
    if pd.isna(value):
        return None
    return str(value)


def _cell_docs(run: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """Each finished cell's JSON by (server, cell)."""
    cells = {}
    for path in _cell_files(run):
        doc = atomic.read_json_if_there(path)
        if doc and "cell" in doc:
            cells[(doc["cell"]["server_id"], doc["cell"]["cell_id"])] = doc
    return cells


def _run_id(run: Path, cells: dict[tuple[str, str], dict[str, Any]], summary: dict[str, Any]) -> tuple[str, str]:
    """A run's experiment and id: a hash of the experiment and of every cell's measurement key and start (a run that
    finished no cell is told apart from another such run by when it ended)."""
    if cells:
        experiment = next(iter(cells.values()))["experiment"]
    elif RunFolder(run).matrix.exists():
        experiment = str(pd.read_parquet(RunFolder(run).matrix, columns=["experiment"])["experiment"].iloc[0])
    else:
        experiment = run.name
    keys = sorted((sid, cid, doc.get("measurement_key"), doc["result"].get("started_at"))
                  for (sid, cid), doc in cells.items())
    ended = {} if keys else {"ended": summary.get("written_at")}
    return experiment, _sha({"experiment": experiment, "cells": keys, **ended})[:12]


def run_id(run: str | Path) -> str:
    """The id a results folder's run has (or will have) in the store."""
    run = Path(run)
    if not run.is_dir():
        raise StoreError(f"{run}: no such results folder (give results/<experiment> of a run)")
    return _run_id(run, _cell_docs(run), atomic.read_json_if_there(RunFolder(run).summary) or {})[1]


def _rows(run: Path) -> tuple[pd.DataFrame, dict[str, dict[str, Any]]]:
    """The run's cells as matrix rows (its matrix.parquet, else each judged cell's row made as aggregate makes it)
    and each cell's JSON by (server, cell)."""
    cells = _cell_docs(run)
    if RunFolder(run).matrix.exists():
        from ..jobs import aggregate

        matrix = aggregate.read_matrix(RunFolder(run).matrix)
    else:  # a run that stopped before its matrix: the cells it judged
        from ..jobs import aggregate

        rows = []
        for (sid, cid), doc in cells.items():
            loops = atomic.read_json_if_there(RunFolder(run).loop(sid, cid))
            if loops:
                rows.append(aggregate.matrix_row(doc, loops))
        matrix = pd.DataFrame(rows)
    return matrix, cells


def manifest(run: str | Path) -> tuple[dict[str, Any], pd.DataFrame, pd.DataFrame]:
    """A results folder read for the store: its run row, its cell rows and its request rows."""
    run = Path(run)
    if not run.is_dir():
        raise StoreError(f"{run}: no such results folder (give results/<experiment> of a run)")
    matrix, cells = _rows(run)
    folder = RunFolder(run)
    summary = atomic.read_json_if_there(folder.summary) or {}
    if matrix.empty and not cells and not summary:
        raise StoreError(f"{run}: no cell results (cells/*/*.json) and no run-summary.json: not a run's results folder")
    lock = atomic.read_json_if_there(folder.runtime_lock) or {}
    models_lock = folder.models_lock.read_bytes() if folder.models_lock.exists() else b""
    provs = [doc.get("provenance") or {} for doc in cells.values()]
    first = lambda key: next((p.get(key) for p in provs if p.get(key) is not None), None)  # noqa: E731
    experiment, run_id = _run_id(run, cells, summary)
    started = sorted(str(doc["result"].get("started_at")) for doc in cells.values() if doc["result"].get("started_at"))
    # a folder kept without its run summary (a recorded run): what it holds, its end unknown
    # a run that finished every job it had and measured no cell (it only pinned the runtime, or stopped at a target
    # before any cell: `--until`) is "empty", not "complete"
    status = ("unknown" if not summary else
              ("complete" if len(matrix) else "empty") if summary.get("succeeded") and not summary.get("failed")
              else "failed" if not summary.get("succeeded") else "partial")
    gpu = matrix["gpu_name"].dropna() if "gpu_name" in matrix else pd.Series(dtype=object)
    row = {
        "run_id": run_id, "experiment": experiment, "status": status, "cells": len(matrix),
        "started_at": started[0] if started else None, "added_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "vllm_version": first("vllm_version"), "runtime_ref": lock.get("runtime_ref") or first("runtime_ref"),
        "packages_sha256": lock.get("packages_sha256") or first("packages_sha256"),
        "models_sha256": hashlib.sha256(models_lock).hexdigest()[:16] if models_lock else None,
        "hostname": first("hostname"), "cpu_model": first("cpu_model"), "cpu_count": first("cpu_count"),
        "machine_id": first("machine_id"), "boot_id": first("boot_id"), "host_probe_ms": _probe_of(provs),
        "gpu_name": str(gpu.iloc[0]) if len(gpu) else None, "gpu_driver": first("gpu_driver"),
        "speedmatrix_commit": first("speedmatrix_commit"), "speedmatrix_version": first("speedmatrix_version"),
        "jobs": summary.get("jobs"), "failed_jobs": summary.get("failed"), "source": str(run.resolve()),
    }
    ids = pd.DataFrame([{"server_id": sid, "cell_id": cid, **cell_identity(doc)} for (sid, cid), doc in cells.items()],
                       columns=["server_id", "cell_id", "config_sha256", "basis_sha256", "measurement_key",
                                "cell_spec", "client_settings"])
    cell_rows = (matrix.merge(ids, on=["server_id", "cell_id"], how="left") if len(matrix)
                 else pd.DataFrame(columns=["server_id", "cell_id", "status"]))  # a run that judged no cell
    cell_rows.insert(0, "run_id", run_id)
    reqs = requests_of(run).reindex(columns=REQUEST_COLUMNS)
    reqs.insert(0, "run_id", run_id)
    return row, cell_rows, reqs


def _probe_of(provs: list[dict[str, Any]]) -> float | None:
    """The run's host probe: the median over its server starts (each cell names its start), None before probes."""
    by_start = {p.get("server_start_id"): p["host_probe_ms"] for p in provs if p.get("host_probe_ms") is not None}
    return round(statistics.median(by_start.values()), 3) if by_start else None


def requests_of(run: str | Path) -> pd.DataFrame:
    """A results folder's requests: its requests.parquet, else its cells' request files (a run cut short)."""
    folder = RunFolder(run)
    if folder.requests.exists():
        return pd.read_parquet(folder.requests)
    tables = [pd.read_parquet(p) for p in folder.cell_request_files()]
    return frames.stack(tables, None if tables else REQUEST_COLUMNS)


@contextmanager
def connect(store: str | Path, create: bool = False) -> Iterator[sqlite3.Connection]:
    """A connection to the store, committed when the block ends. A store kept compressed (``history.sqlite.gz``,
    as an archived record keeps it) is read from a decompressed copy that is deleted afterwards: nothing is added
    to it."""
    store = Path(store)
    if not create and not store.exists():
        raise StoreError(f"{store}: no results store here yet (a finished run adds itself: `make run`; or "
                         "`speedmatrix history --add results/<experiment>`)")
    if store.suffix == ".gz":
        if create:
            raise StoreError(f"{store}: a compressed store is read-only; `gunzip -k {store}` and add to the "
                             f"{store.with_suffix('')} it gives")
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / store.stem
            with gzip.open(store) as src, copy.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            with connect(copy) as con:
                yield con
        return
    store.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(store, timeout=60)
    try:
        con.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        con.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        yield con
        con.commit()
    finally:
        con.close()


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]


def _append(con: sqlite3.Connection, table: str, frame: pd.DataFrame, key: str | None = None) -> None:
    """Append rows, adding any column the table does not have yet (a later version's matrix has more)."""
    frame = frame.astype(object).where(frame.notna(), None).map(_jsonable) if len(frame) else frame
    have = _columns(con, table)
    if not have:
        cols = ", ".join(f'"{c}"' + (" PRIMARY KEY" if c == key else "") for c in frame.columns)
        con.execute(f'CREATE TABLE "{table}" ({cols})')
        have = list(frame.columns)
    for col in frame.columns:
        if col not in have:
            con.execute(f'ALTER TABLE "{table}" ADD COLUMN "{col}"')
    if len(frame):
        marks = ", ".join("?" for _ in frame.columns)
        names = ", ".join(f'"{c}"' for c in frame.columns)
        con.executemany(f'INSERT INTO "{table}" ({names}) VALUES ({marks})', frame.itertuples(index=False, name=None))


def add(run: str | Path, store: str | Path) -> tuple[str, bool]:
    """Add a results folder's run to the store: (its run id, whether it was new). One transaction: a run is in the
    store whole or not at all."""
    row, cells, reqs = manifest(run)
    try:
        with connect(store, create=True) as con:
            if "runs" in _tables(con) and con.execute("SELECT 1 FROM runs WHERE run_id = ?",
                                                      (row["run_id"],)).fetchone():
                return row["run_id"], False
            _append(con, "runs", pd.DataFrame([row], columns=RUN_COLUMNS), key="run_id")
            _append(con, "cells", cells)
            _append(con, "requests", reqs)
            for table in ("cells", "requests"):
                con.execute(f'CREATE INDEX IF NOT EXISTS "{table}_by_cell" ON "{table}" (run_id, server_id, cell_id)')
    except sqlite3.Error as err:  # a damaged or locked file: said, with where it is
        raise StoreError(f"{store}: {err} (the run was not added; a damaged store can be moved aside, a new one "
                         "starts with the next run)") from None
    return row["run_id"], True


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def runs(store: str | Path, experiment: str | None = None) -> pd.DataFrame:
    """The stored runs (of one experiment), oldest first, each with its tags (comma-separated)."""
    with connect(store) as con:
        if "runs" not in _tables(con):
            return pd.DataFrame(columns=[*RUN_COLUMNS, "tags"])
        query, args = "SELECT * FROM runs", ()
        if experiment:
            query, args = query + " WHERE experiment = ?", (experiment,)
        found = pd.read_sql_query(query + " ORDER BY started_at, added_at", con, params=args)
        named = (pd.read_sql_query("SELECT name, run_id FROM tags ORDER BY name", con) if "tags" in _tables(con)
                 else pd.DataFrame(columns=["name", "run_id"]))
    by_run = named.groupby("run_id")["name"].agg(", ".join)
    return found.assign(tags=found["run_id"].map(by_run).fillna(""))


LATEST = "latest"  # the newest stored run (by start), wherever a run id is asked for


def resolve(store: str | Path, ref: str) -> str:
    """A run id from the results folder it was read from, a tag (``history --tag``), ``latest`` (the newest run
    stored, by start), or a unique start of one."""
    found = runs(store)
    if Path(ref).is_dir():
        hit = found[found["source"] == str(Path(ref).resolve())]
    elif ref in (tags := tag_names(store)):
        return tags[ref]
    elif ref == LATEST:
        hit = found.tail(1)
    else:
        hit = found[found["run_id"].str.startswith(ref)]
    if len(hit) != 1:
        what = "no run" if hit.empty else f"{len(hit)} runs ({', '.join(hit['run_id'])})"
        raise StoreError(f"{ref}: {what} in {store} matches (list them with `speedmatrix history`; a run is named "
                         "by a unique start of its id, a tag, latest, or the results folder it was added from)")
    return str(hit["run_id"].iloc[-1])


def tag_names(store: str | Path) -> dict[str, str]:
    """Every tag with the run it names."""
    with connect(store) as con:
        if "tags" not in _tables(con):
            return {}
        return dict(con.execute("SELECT name, run_id FROM tags"))


TAG = re.compile(r"[A-Za-z][\w.-]*")


def tag(store: str | Path, name: str, ref: str) -> str:
    """Name a run (``baseline``, ``v0.26.0``): the tag moves to it from any run it named before. Returns the run."""
    if not TAG.fullmatch(name) or name == LATEST:
        raise StoreError(f"tag {name!r}: a tag is a letter then letters, digits, '.', '_' or '-', and not "
                         f"{LATEST!r} (it always names the newest run)")
    run_id = resolve(store, ref)
    with connect(store, create=True) as con:  # a compressed store is refused: read-only
        con.execute("CREATE TABLE IF NOT EXISTS tags (name TEXT PRIMARY KEY, run_id TEXT, tagged_at TEXT)")
        con.execute("INSERT OR REPLACE INTO tags VALUES (?, ?, ?)",
                    (name, run_id, time.strftime("%Y-%m-%dT%H:%M:%S%z")))
    return run_id


def untag(store: str | Path, name: str) -> None:
    if name not in tag_names(store):
        known = ", ".join(sorted(tag_names(store))) or "none"
        raise StoreError(f"tag {name!r}: no such tag in {store} (its tags: {known})")
    with connect(store, create=True) as con:
        con.execute("DELETE FROM tags WHERE name = ?", (name,))


def remove(store: str | Path, ref: str) -> str:
    """Take a run out of the store: its row, its cells, its requests and its tags (one transaction). Returns its id."""
    run_id = resolve(store, ref)
    with connect(store, create=True) as con:
        for table in ("runs", "cells", "requests", "tags"):
            if table in _tables(con):
                con.execute(f'DELETE FROM "{table}" WHERE run_id = ?', (run_id,))
    return run_id


def cells(store: str | Path, run_id: str) -> pd.DataFrame:
    with connect(store) as con:
        if "cells" not in _tables(con):  # a store no run was added to yet
            return pd.DataFrame()
        return pd.read_sql_query("SELECT * FROM cells WHERE run_id = ?", con, params=(run_id,))


def stored_cells(store: str | Path) -> list[str]:
    """Every server/cell the store holds, once each (what `history --cell` can be given)."""
    with connect(store) as con:
        if "cells" not in _tables(con):
            return []
        return [f"{s}/{c}" for s, c in con.execute("SELECT DISTINCT server_id, cell_id FROM cells ORDER BY 1, 2")]


def requests(store: str | Path, run_id: str) -> pd.DataFrame:
    with connect(store) as con:
        return pd.read_sql_query("SELECT * FROM requests WHERE run_id = ?", con, params=(run_id,))


def cell_history(store: str | Path, server_id: str | None = None, cell_id: str | None = None,
                 experiment: str | None = None) -> pd.DataFrame:
    """One cell (or every cell, without ``server_id``/``cell_id``) in every stored run: the run's manifest beside the
    cell's figures, oldest first."""
    with connect(store) as con:
        if not {"cells", "runs"} <= _tables(con):  # a store no run was added to yet
            return pd.DataFrame()
        query = ("SELECT r.started_at AS run_started_at, r.vllm_version AS run_vllm_version, r.status AS run_status, "
                 "r.hostname AS run_hostname, r.speedmatrix_commit, r.experiment AS run_experiment, "
                 "r.runtime_ref AS run_runtime_ref, r.gpu_name AS run_gpu_name, r.cpu_model AS run_cpu_model, "
                 "r.cpu_count AS run_cpu_count, c.* FROM cells c JOIN runs r USING (run_id) WHERE 1 = 1")
        args: tuple = ()
        if server_id is not None:
            query, args = query + " AND c.server_id = ? AND c.cell_id = ?", (server_id, cell_id)
        if experiment:
            query, args = query + " AND r.experiment = ?", (*args, experiment)
        return pd.read_sql_query(query + " ORDER BY r.started_at, r.added_at", con, params=args)


def folder_keys(run: str | Path) -> tuple[str, pd.DataFrame, dict[str, Any]]:
    """A results folder as a family's keys, from one read of its cell files: its run id, its cells (server, cell,
    server config hash) and its kind of machine as the store records it (GPU name, CPU model, core count)."""
    run = Path(run)
    docs = _cell_docs(run)
    keys = pd.DataFrame([{"server_id": sid, "cell_id": cid, "config_sha256": cell_identity(doc)["config_sha256"]}
                         for (sid, cid), doc in docs.items()], columns=["server_id", "cell_id", "config_sha256"])
    provs = [doc.get("provenance") or {} for doc in docs.values()]
    matrix = RunFolder(run).matrix
    gpu = (pd.read_parquet(matrix, columns=["gpu_name"])["gpu_name"].dropna() if matrix.exists()
           else pd.Series(dtype=object))
    first = lambda key: next((p.get(key) for p in provs if p.get(key) is not None), None)  # noqa: E731
    machine = {"gpu_name": str(gpu.iloc[0]) if len(gpu) else None, "cpu_model": first("cpu_model"),
               "cpu_count": first("cpu_count")}
    run_id = _run_id(run, docs, atomic.read_json_if_there(RunFolder(run).summary) or {})[1]
    return run_id, keys, machine


def family(store: str | Path, experiment: str | None = None, keys: pd.DataFrame | None = None) -> pd.DataFrame:
    """A family of cells across runs: every stored row of a cell in ``keys`` (server, cell and server config hash;
    default: the cells of ``experiment``'s newest stored run) with that server config (flags, environment,
    models), in any run of any experiment, so that ``extends:`` children and runs on other releases line up and a
    changed flag does not. Oldest first."""
    if keys is None:
        newest = runs(store, experiment)
        if newest.empty:
            return pd.DataFrame()
        keys = cells(store, str(newest["run_id"].iloc[-1]))
    rows = cell_history(store)
    if keys.empty or rows.empty:
        return pd.DataFrame()
    keys = keys[["server_id", "cell_id", "config_sha256"]].drop_duplicates()
    return rows.merge(keys, on=["server_id", "cell_id", "config_sha256"]).sort_values(
        ["run_started_at", "server_id", "cell_id"], kind="stable").reset_index(drop=True)
