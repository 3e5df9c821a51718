"""Logging for the rule scripts: everything a job prints goes to its Snakemake log, timestamped."""

from __future__ import annotations

import contextlib
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from .errors import SpeedmatrixError


class _Stamped:
    def __init__(self, fh: TextIO) -> None:
        self.fh = fh
        self.at_line_start = True

    def write(self, s: str) -> int:
        for part in s.splitlines(keepends=True):
            if self.at_line_start:  # the time of day to the millisecond (speedmatrix walltime reads it)
                now = time.time()
                self.fh.write(time.strftime("[%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}] ")
            self.fh.write(part)
            self.at_line_start = part.endswith("\n")
        self.fh.flush()
        return len(s)

    def flush(self) -> None:
        self.fh.flush()


@contextlib.contextmanager
def to_file(path: str | Path) -> Iterator[None]:
    """Send stdout and stderr (tracebacks included) to ``path`` for the duration of a job."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        stamped = _Stamped(fh)
        old = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = stamped
        try:
            yield
        except SpeedmatrixError as err:
            # a failure with a message for the user: one line, in the log and on the job's stderr, no traceback
            print(f"ERROR: {err}")
            raise SystemExit(f"speedmatrix: {err}") from None
        except BaseException:
            traceback.print_exc()
            raise
        finally:
            sys.stdout, sys.stderr = old


def progress(msg: str) -> None:
    print(msg, flush=True)
