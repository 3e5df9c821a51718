"""A run against a published matrix: does it reproduce the seed's table?

A published matrix is a tracked file (``config/published/*.yaml``: the seed's tables as printed, with their
source). ``speedmatrix reproduce RUN PUBLISHED`` compares, cell by cell: each sustained-decode cell's status
(Valid / Looped / Over capacity) in the run and in the published table, the valid cells' figures as the run's over
the published (with the run's 95 % interval where it had repeats), the prefill rows likewise, and the over-capacity
boundary of each context row: where it falls in each, and in the run as multiples of its KV cache (the context x
concurrency a cell needs over the cache the server had), so that a run on other hardware or a ``-tiny`` twin, whose
contexts are smaller, is compared on its shape. Rows and columns are matched in order: the run's i-th context
with the published i-th, concurrency by value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from .. import workloads
from ..core.errors import ConfigError
from ..core.status import Status
from .gate import MEANING, Outcome

STATUSES = (Status.VALID, Status.LOOPED, Status.OVER_CAPACITY)


def _published_as(form: str) -> str:
    """The kind a published file gives in this form ("grid": context x concurrency statuses; "rows": figures per
    context), whose name is the file's table for it (``Workload.published``)."""
    return next(n for n in workloads.names() if workloads.get(n).published == form)


# a published file's tables, each named for the kind of cell it holds: the matrix (context x concurrency, with
# statuses) and the per-context rows
MATRIX_TABLE, ROWS_TABLE = _published_as("grid"), _published_as("rows")
# a run's status as the published tables write it (unstable: a figure, with a wide spread)
AS_PUBLISHED = {Status.VALID: Status.VALID, Status.UNSTABLE: Status.VALID, Status.LOOPED: Status.LOOPED,
                Status.OVER_CAPACITY: Status.OVER_CAPACITY}


def load(path: str | Path) -> dict[str, Any]:
    """A published matrix, checked: an error names the file and the key."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such published matrix (config/published/ holds the seeds')")
    doc = yaml.safe_load(path.read_text()) or {}
    if "source" not in doc:
        raise ConfigError(f"{path}: key 'source' is missing (where the tables come from)")
    if MATRIX_TABLE not in doc and "rows" not in doc:
        raise ConfigError(f"{path}: no table: give '{MATRIX_TABLE}' (a context x concurrency matrix) or 'rows' "
                          "(figures of named cells)")
    cols = (doc.get("rows") or {}).get("columns") or []
    if "rows" in doc and not {"server_id", "context", "concurrency"} <= set(cols):
        raise ConfigError(f"{path}: key 'rows.columns' must name server_id, context and concurrency")
    dec = doc.get(MATRIX_TABLE) or {}
    conc = dec.get("concurrency") or []
    for ctx, row in (dec.get("status") or {}).items():
        if len(row) != len(conc):
            raise ConfigError(f"{path}: key 'decode.status.{ctx}': {len(row)} statuses for {len(conc)} concurrencies")
        bad = [s for s in row if s not in STATUSES]
        if bad:
            raise ConfigError(f"{path}: key 'decode.status.{ctx}': {bad[0]!r} is not one of {', '.join(STATUSES)}")
    doc["path"] = str(path)
    return doc


def _table(block: dict[str, Any] | None) -> pd.DataFrame:
    return pd.DataFrame((block or {}).get("rows") or [], columns=(block or {}).get("columns") or [])


def decode_cells(published: dict[str, Any]) -> pd.DataFrame:
    dec = published[MATRIX_TABLE]
    rows = [{"context": int(ctx), "concurrency": c, "status": s}
            for ctx, statuses in dec["status"].items() for c, s in zip(dec["concurrency"], statuses)]
    cells = pd.DataFrame(rows)
    figs = _table(dec.get("figures"))
    return cells.merge(figs, on=["context", "concurrency"], how="left") if len(figs) else cells


def _ranked(values) -> dict[int, int]:
    return {v: i for i, v in enumerate(sorted(set(int(x) for x in values)))}


def named_rows(matrix: pd.DataFrame, published: dict[str, Any], gpu: str | None = None) -> pd.DataFrame:
    """Published figures of named cells (server config, context, concurrency) beside the run's same cells."""
    pub = _table(published.get("rows"))
    if pub.empty:
        return pub
    if gpu and "gpu" in pub:
        pub = pub[pub["gpu"] == gpu]
    run = matrix.rename(columns={"context_tokens": "context"})
    keep = ["server_id", "context", "concurrency", "status", "total_tok_s", "total_tok_s_ci_low",
            "total_tok_s_ci_high", "p95_ttft_ms"]
    both = pub.merge(run[[c for c in keep if c in run]], on=["server_id", "context", "concurrency"], how="left",
                     suffixes=("_published", ""))
    for col in ("total_tok_s", "p95_ttft_ms"):
        if f"{col}_published" in both:
            both[f"{col}_ratio"] = both[col] / both[f"{col}_published"]
    return both


def check_experiment(matrix: pd.DataFrame, published: dict[str, Any]) -> None:
    """A run of an experiment the published file does not name (its ``experiments:``) is refused: another
    experiment's cells would be read as this table's."""
    named = published.get("experiments") or []
    ran = sorted({str(e) for e in matrix.get("experiment", pd.Series(dtype=object)).dropna()})
    if named and ran and not set(ran) & set(named):
        raise ConfigError(f"{published['path']}: the run is of {', '.join(ran)}, which its 'experiments' key does not "
                          f"name ({', '.join(named)}); give --any-experiment to compare it all the same")


def outcome(found: dict[str, Any], min_agreement: float | None = None,
            tolerance: float = 0.10) -> tuple[Outcome, str]:
    """The reproduction's exit status (history.gate) and why: nothing comparable where no published figure has a
    cell of the run; the check failed (1) where the share that agrees is under ``min_agreement``: the statuses of
    the matrix's cells, and the named figures whose output tok/s is within ``tolerance`` of the published."""
    s, named = found["summary"], found.get("named", pd.DataFrame())
    if not s["measured"] and not s.get("named_measured"):
        return Outcome.NOTHING_COMPARABLE, "no published figure has a cell of the same shape in the run"
    shares = []
    if s["measured"]:
        shares.append(("statuses", s["agree"], s["measured"]))
    if len(named) and "total_tok_s_ratio" in named and named["total_tok_s_ratio"].notna().any():
        ratio = named["total_tok_s_ratio"].dropna()
        shares.append((f"output tok/s within {tolerance:.0%}", int(((ratio - 1).abs() <= tolerance).sum()),
                       int(len(ratio))))
    said = "; ".join(f"{what}: {n} of {of} agree" for what, n, of in shares)
    if min_agreement is not None and any(n / of < min_agreement for _, n, of in shares if of):
        return Outcome.SLOWER, f"{said}, under the minimum agreement {min_agreement:.0%}"
    return Outcome.PASS, said


def verdict_json(found: dict[str, Any], code: Outcome, why: str) -> dict[str, Any]:
    """The reproduction for a machine: the outcome, its exit status and meaning, why, the summary's counts, and
    the rows (each published decode cell beside the run's, each named figure beside the run's)."""
    def records(frame: Any) -> list[dict[str, Any]]:
        return json.loads(frame.to_json(orient="records")) if isinstance(frame, pd.DataFrame) and len(frame) else []

    return {"outcome": code.name.lower(), "exit_status": int(code), "meaning": MEANING[code], "why": why,
            "summary": found["summary"], "cells": records(found["cells"]), "named": records(found.get("named")),
            "rows": records(found["rows"])}


def verdict_junit(found: dict[str, Any], tolerance: float = 0.10) -> str:
    """The reproduction as JUnit XML: a test case per published decode cell (its status as published, or a
    failure) and per named figure (output tok/s within ``tolerance``, or a failure); one the run lacks is skipped."""
    import xml.etree.ElementTree as ET

    suite = ET.Element("testsuite", name=f"speedmatrix reproduce {found['summary']['published']}")
    counts = {"tests": 0, "failures": 0, "skipped": 0}

    def case(classname: str, name: str, failed: str | None, skipped: str | None = None) -> None:
        c = ET.SubElement(suite, "testcase", classname=classname, name=name)
        counts["tests"] += 1
        if skipped:
            counts["skipped"] += 1
            ET.SubElement(c, "skipped", message=skipped)
        elif failed:
            counts["failures"] += 1
            ET.SubElement(c, "failure", type="disagrees", message=failed)

    cells = found["cells"]
    for r in (cells.itertuples() if len(cells) else []):
        name = f"ctx{r.context} c{int(r.concurrency)}"
        if pd.isna(r.status_as_measured):
            case("status", name, None, "the run has no such cell")
        else:
            case("status", name, None if r.agree else f"published {r.status_published}, run {r.status_run}")
    named = found.get("named", pd.DataFrame())
    for r in (named.itertuples() if len(named) else []):
        name = f"{r.server_id} ctx{int(r.context)} c{int(r.concurrency)}"
        ratio = getattr(r, "total_tok_s_ratio", None)
        if ratio is None or pd.isna(ratio):
            case("output tok/s", name, None, "the run has no figure for it")
        else:
            case("output tok/s", name, None if abs(ratio - 1) <= tolerance else
                 f"run / published {ratio:.3f}, beyond {tolerance:.0%}")
    for key, value in counts.items():
        suite.set(key, str(value))
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def compare(matrix: pd.DataFrame, published: dict[str, Any], server_id: str | None = None,
            gpu: str | None = None) -> dict[str, Any]:
    """The comparison's tables: ``cells`` (every published decode cell beside the run's), ``rows`` (each context
    row's over-capacity boundary), ``prefill``, ``named`` (published figures of named cells beside the run's) and a
    ``summary`` of counts."""
    named = named_rows(matrix, published, gpu)
    if MATRIX_TABLE not in published:
        matched = int(named["status"].notna().sum()) if len(named) else 0
        return {"cells": pd.DataFrame(), "rows": pd.DataFrame(), "prefill": pd.DataFrame(), "named": named,
                "summary": {"cells": 0, "measured": 0, "agree": 0, "rows": 0, "same_boundary": 0,
                            "named": int(len(named)), "named_measured": matched, "published": published["path"],
                            "source": " ".join(str(published["source"]).split())}}
    if server_id:
        matrix = matrix[matrix["server_id"] == server_id]
    elif matrix["server_id"].nunique() > 1:
        raise ConfigError(f"the run has several server configs ({', '.join(sorted(matrix['server_id'].unique()))}):"
                          " name one with --server")
    run = _of_kind(matrix, MATRIX_TABLE).drop_duplicates(["context_tokens", "concurrency"])
    pub = decode_cells(published)
    run_rank, pub_rank = _ranked(run["context_tokens"]), _ranked(pub["context"])
    run = run.assign(rank=run["context_tokens"].map(run_rank))
    pub = pub.assign(rank=pub["context"].map(pub_rank))
    both = pub.merge(run, on=["rank", "concurrency"], how="left", suffixes=("_published", ""))
    # as the published matrix words it (a plain word in the table, as every status is)
    both["status_run"] = [s if s is None else str(AS_PUBLISHED.get(s, s)) for s in both["status"]]
    both["agree"] = both["status_run"] == both["status_published"]
    kv = both["kv_cache_size_tokens"].astype(float)
    both["kv_multiple"] = (both["needed_kv_tokens"].astype(float) / kv).where(kv > 0)
    both["published_tokens"] = both["context"] * both["concurrency"]
    for col in ("total_tok_s", "ttft_ms", "tbt_ms"):
        pcol = f"{col}_published" if f"{col}_published" in both else col
        if pcol in both and col in both and pcol != col:
            both[f"{col}_ratio"] = both[col] / both[pcol]
    cells = both.rename(columns={"status": "status_as_measured"})
    rows = []
    for _, g in cells.groupby("rank"):
        g = g.sort_values("concurrency")
        at_run = _first_over(g, "status_run")
        kv_at = g.loc[g["concurrency"] == at_run, "kv_multiple"]
        fit = g.loc[g["status_run"] != Status.OVER_CAPACITY, "kv_multiple"]
        rows.append({"published_context": int(g["context"].iloc[0]),
                     "run_context": int(g["context_tokens"].dropna().iloc[0]) if g["context_tokens"].notna().any()
                     else None,
                     "published_first_over": _first_over(g, "status_published"), "run_first_over": at_run,
                     "run_kv_multiple_first_over": float(kv_at.iloc[0]) if len(kv_at) else None,
                     "run_kv_multiple_largest_fit": float(fit.max()) if fit.notna().any() else None})
    rows = pd.DataFrame(rows)
    rows["same_boundary"] = (pd.to_numeric(rows["published_first_over"]).fillna(0)
                             == pd.to_numeric(rows["run_first_over"]).fillna(0))
    prefill = _prefill(matrix, published)
    measured = cells["status_as_measured"].notna()
    summary = {"cells": int(len(cells)), "measured": int(measured.sum()), "named": int(len(named)),
               "named_measured": int(named["status"].notna().sum()) if len(named) else 0,
               "agree": int(cells.loc[measured, "agree"].sum()), "rows": int(len(rows)),
               "same_boundary": int(rows["same_boundary"].sum()), "published": published["path"],
               "source": " ".join(str(published["source"]).split())}
    return {"cells": cells, "rows": rows, "prefill": prefill, "named": named, "summary": summary}


def _of_kind(matrix: pd.DataFrame, table: str) -> pd.DataFrame:
    """The run's cells of the kind a published table is named for."""
    return matrix[matrix["workload"].eq(table)]


def _first_over(row: pd.DataFrame, column: str) -> int | None:
    """A context row's smallest concurrency over capacity (None: none is)."""
    return next((int(c) for c, s in zip(row["concurrency"], row[column]) if s == Status.OVER_CAPACITY), None)


def _prefill(matrix: pd.DataFrame, published: dict[str, Any]) -> pd.DataFrame:
    pub = _table(published.get(ROWS_TABLE))
    run = _of_kind(matrix, ROWS_TABLE).drop_duplicates("context_tokens")
    if pub.empty or run.empty:
        return pd.DataFrame()
    pub = pub.assign(rank=pub["context"].map(_ranked(pub["context"])))
    run = run.assign(rank=run["context_tokens"].map(_ranked(run["context_tokens"])))
    both = pub.merge(run[["rank", "context_tokens", "status", "prompt_tok_s", "ttft_ms"]], on="rank", how="left",
                     suffixes=("_published", ""))
    both["prompt_tok_s_ratio"] = both["prompt_tok_s"] / both["prompt_tok_s_published"]
    both["ttft_ms_ratio"] = both["ttft_ms"] / both["ttft_ms_published"]
    return both
