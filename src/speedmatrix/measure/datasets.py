"""Prompts from a dataset instead of the synthetic corpus: local files with a column mapping, or a Hugging Face
dataset at a pinned revision, pinned like a model.

An experiment names its datasets (``datasets:``) and a workload block uses one
with ``corpus: <name>``. Each format is one loader in :data:`FORMATS`, turning
the source into :class:`Record` s (a prompt, and where the format has them a
reference output and a category):

- ``table``: JSONL, CSV or Parquet with a column mapping (``columns: {prompt,
  output, output_tokens, category, id}``; only ``prompt`` is required);
- ``sharegpt``: JSON or JSONL conversations (``conversations: [{from, value}]``):
  the first human turn, the reply after it as the reference output;
- ``specbench``: SpecBench's ``question.jsonl`` (``category``, ``turns``): the
  first turn, with its category.

A ``path`` is a local file; ``hf: <repo>`` with a ``revision`` (a commit) loads
the Hub dataset through the ``datasets`` library (its cache, or the Hub), and the
chosen format reads its rows. The lock (``datasets.lock``, beside
``models.lock``) records each dataset's source, revision, rows and the SHA-256 of
its file or of its rows, and every cell that uses it carries that entry.

**The length rule**: a cell's prompts are the records whose prompt, with the
8-token nonce that keeps the prefix cache from matching across requests, fits
the cell's context (``contexts`` is the longest prompt sent, never a length
prompts are cut or padded to); longer records are skipped, and the cell records
how many. A record's reference output, where the format has one, caps that
request's ``max_tokens`` at its token count (the cell's ``max_tokens`` caps all).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..core import atomic
from ..core.errors import DatasetError

BUILTIN_CORPORA = ("prose", "code")


@dataclass(frozen=True)
class Record:
    """One prompt of a dataset."""

    prompt: str
    output: str | None = None  # the reference answer, where the format has one
    output_tokens: int | None = None  # its length in tokens, where the format gives it
    category: str | None = None
    id: str | None = None
    turns: tuple[str, ...] = ()  # a conversation's later user turns, where the format has them (sharegpt)


def _rows_of_file(path: Path) -> list[dict[str, Any]]:
    import pandas as pd

    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return atomic.read_jsonl(path)
    if suffix == ".json":
        data = atomic.read_json(path)
        return data if isinstance(data, list) else [data]
    if suffix == ".csv":
        return pd.read_csv(path, keep_default_na=False).to_dict("records")
    if suffix == ".parquet":
        return pd.read_parquet(path).to_dict("records")
    raise DatasetError(f"{path}: a dataset file is .jsonl, .json, .csv or .parquet, not {suffix or 'no suffix'}")


def _text(v: Any) -> str | None:
    return None if v is None or (isinstance(v, float) and v != v) else str(v)


def table(rows: Iterable[dict[str, Any]], spec: dict[str, Any]) -> list[Record]:
    cols = spec.get("columns") or {}
    prompt = cols.get("prompt", "prompt")
    out = []
    for i, row in enumerate(rows):
        if prompt not in row:
            raise DatasetError(f"{spec['_where']}: row {i} has no column {prompt!r} (columns.prompt; it has "
                               f"{', '.join(map(str, list(row)[:8]))})")
        n = row.get(cols["output_tokens"]) if "output_tokens" in cols else None
        out.append(Record(prompt=str(row[prompt]), output=_text(row.get(cols["output"])) if "output" in cols else None,
                          output_tokens=None if n in (None, "") else int(n),
                          category=_text(row.get(cols["category"])) if "category" in cols else None,
                          id=_text(row.get(cols["id"])) if "id" in cols else str(i)))
    return out


def sharegpt(rows: Iterable[dict[str, Any]], spec: dict[str, Any]) -> list[Record]:
    out = []
    for i, row in enumerate(rows):
        turns = row.get("conversations") or row.get("conversation")
        if not isinstance(turns, list):
            raise DatasetError(f"{spec['_where']}: row {i} has no 'conversations' list (format sharegpt)")
        human = next((k for k, t in enumerate(turns) if t.get("from") in ("human", "user")), None)
        if human is None:
            continue  # a conversation without a human turn has no prompt
        reply = turns[human + 1]["value"] if human + 1 < len(turns) else None
        later = tuple(t["value"] for t in turns[human + 1:] if t.get("from") in ("human", "user"))
        out.append(Record(prompt=turns[human]["value"], output=reply, id=str(row.get("id", i)), turns=later))
    return out


def specbench(rows: Iterable[dict[str, Any]], spec: dict[str, Any]) -> list[Record]:
    out = []
    for i, row in enumerate(rows):
        if not row.get("turns"):
            raise DatasetError(f"{spec['_where']}: row {i} has no 'turns' (format specbench)")
        out.append(Record(prompt=row["turns"][0], category=row.get("category"),
                          id=str(row.get("question_id", i))))
    return out


# format -> its loader (rows, the dataset's spec) -> records
FORMATS: dict[str, Callable[[Iterable[dict[str, Any]], dict[str, Any]], list[Record]]] = {
    "table": table, "sharegpt": sharegpt, "specbench": specbench,
}


def _hub_rows(spec: dict[str, Any]) -> list[dict[str, Any]]:
    import datasets as hf

    try:
        ds = hf.load_dataset(spec["hf"], spec.get("config"), revision=spec["revision"],
                             split=spec.get("split", "train"))
    except Exception as exc:  # offline without the cache, a wrong name or revision: say which
        raise DatasetError(f"dataset {spec['hf']!r} at revision {spec['revision']}: {type(exc).__name__}: "
                           f"{str(exc)[:300]} (pre-fetch it where the Hub is reachable; the datasets library's "
                           "cache, HF_DATASETS_CACHE, is read offline)") from None
    return list(ds)


def _resolve(spec: dict[str, Any], base: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The dataset's rows and its source as the lock records it."""
    if "hf" in spec:
        rows = _hub_rows(spec)
        digest = hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()
        return rows, {"hf": spec["hf"], "revision": spec["revision"], "split": spec.get("split", "train"),
                      "rows_sha256": digest}
    path = Path(spec["path"])
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise DatasetError(f"{spec['_where']}: no file {path}")
    return _rows_of_file(path), {"path": str(spec["path"]), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def is_trace(spec: dict[str, Any] | None) -> bool:
    """Whether a dataset's format is a trace's (speedmatrix.measure.traces: requests with times, not prompts)."""
    from . import traces

    return bool(spec) and spec.get("format") in traces.FORMATS


def load(name: str, spec: dict[str, Any], base: str | Path = ".") -> tuple[list, dict[str, Any]]:
    """A dataset's records, in file order, and its lock entry. ``base``: where a relative path starts. A trace's
    records are its requests in time order (speedmatrix.measure.traces)."""
    from . import traces

    spec = {**spec, "_where": spec.get("_where") or f"dataset {name!r} ({spec.get('path') or spec.get('hf')})"}
    fmt = spec.get("format", "table")
    if fmt not in FORMATS and fmt not in traces.FORMATS:
        known = ", ".join([*FORMATS, *traces.FORMATS])
        raise DatasetError(f"{spec['_where']}: unknown format {fmt!r} (known: {known})")
    rows, source = _resolve(spec, Path(base))
    if fmt in traces.FORMATS:
        try:
            reqs = traces.FORMATS[fmt](rows, spec)
        except traces.TraceError as exc:
            raise DatasetError(str(exc)) from None
        if not reqs:
            raise DatasetError(f"{spec['_where']}: no request in it")
        return reqs, {"name": name, "format": fmt, **source, **traces.summary(reqs)}
    records = [r for r in FORMATS[fmt](rows, spec) if r.prompt.strip()]
    limit = spec.get("limit")
    if limit:
        records = records[: int(limit)]
    if not records:
        raise DatasetError(f"{spec['_where']}: no prompt in it")
    categories = sorted({r.category for r in records if r.category})
    return records, {"name": name, "format": fmt, **source, "records": len(records), "categories": categories}


def lock(datasets: dict[str, dict[str, Any]], base: str | Path = ".") -> dict[str, Any]:
    """Every dataset of an experiment loaded once: the lock's entries by name."""
    return {name: load(name, spec, base)[1] for name, spec in (datasets or {}).items()}


def records_as_json(records: list[Record]) -> list[dict[str, Any]]:
    return [asdict(r) for r in records]


def is_dataset(corpus: str) -> bool:
    """Whether a block's ``corpus`` names a dataset of the experiment (not a built-in corpus)."""
    return corpus not in BUILTIN_CORPORA
