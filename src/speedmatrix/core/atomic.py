"""Write files once and atomically (a reader never sees a half-written result), and read JSON back."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import ResultFileError


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# read at import (one thread): a file written here gets the mode a plain open() would give it (0644 under the usual
# umask), not mkstemp's 0600, so that the group and others read results as they read the CSVs beside them
MODE = 0o666 & ~_umask()


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), MODE)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


def read_json(path: str | os.PathLike) -> Any:
    """The JSON in ``path``; one that is not JSON raises :class:`ResultFileError` naming the file and where it
    stops being JSON (a ``ValueError`` too, as ``json`` raises)."""
    with open(path, encoding="utf-8") as fh:
        try:
            return json.load(fh)
        except json.JSONDecodeError as err:
            raise ResultFileError(
                f"{path}: not JSON ({err.msg} at line {err.lineno}, column {err.colno}): the file is damaged; "
                "delete it and run the workflow again to make it anew (only the job that wrote it reruns)") from err


def read_jsonl(path: str | os.PathLike) -> list[Any]:
    """Every record of a JSON-lines file (blank lines skipped); a line that is not JSON raises
    :class:`ResultFileError` naming the file and the line."""
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ResultFileError(f"{path}: line {n} is not JSON ({err.msg}): the file is damaged; delete the line "
                                  "(or the file, and run the jobs that wrote it again)") from err
    return out


def read_json_if_there(path: str | os.PathLike) -> Any | None:
    """The JSON in ``path``, or None where there is none to read: missing (a state file another process
    removes when it ends) or not JSON. Where a file must be there, :func:`read_json` raises instead."""
    try:
        return read_json(path)
    except (FileNotFoundError, ValueError):
        return None
