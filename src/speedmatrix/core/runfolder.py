"""A run's folder, ``results/<experiment>/``: every file name in it is named here, as ``serve/state.py`` names a
server's. The rules build their outputs from these names (``rules/common.smk``) and the library reads them back
through :class:`RunFolder`; a server config's own folder under ``servers/`` is ``serve/state.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# the run's tables (one row per cell, per request, per cell and latency target) and its report
MATRIX = "matrix.parquet"
REQUESTS = "requests.parquet"
DECISIONS = "decisions.parquet"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
# what the run ran with, and how it ended
RUNTIME_LOCK = "runtime.lock.json"
MODELS_LOCK = "models.lock"
DATASETS_LOCK = "datasets.lock"
SUMMARY = "run-summary.json"
# folders: each cell's result and its requests, each cell's loop verdict, each server config's state, the charts,
# the losslessness check's outputs and verdicts, the other clients' rounds, every job's log
CELLS = "cells"
LOOPS = "loops"
SERVERS = "servers"
CHARTS = "charts"
LOSSLESS = "lossless"
REFERENCE = "reference"
LOGS = "logs"
# every finished measurement, kept apart from the cells' outputs and keyed by what it depends on, so that a cell
# whose outputs were removed is restored, not measured again (the measurement archive; not the results store)
ARCHIVE = "archive"
ARCHIVE_BEFORE = "store"  # its name before 2026-12-07, still read
CELL_REQUESTS_SUFFIX = ".requests.parquet"
# beside the run folders, under the results root: the store every run adds itself to
HISTORY = "history.sqlite"


@dataclass(frozen=True)
class RunFolder:
    """The paths of one run's folder."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def matrix(self) -> Path:
        return self.root / MATRIX

    @property
    def requests(self) -> Path:
        return self.root / REQUESTS

    @property
    def decisions(self) -> Path:
        return self.root / DECISIONS

    @property
    def report_md(self) -> Path:
        return self.root / REPORT_MD

    @property
    def report_html(self) -> Path:
        return self.root / REPORT_HTML

    @property
    def runtime_lock(self) -> Path:
        return self.root / RUNTIME_LOCK

    @property
    def models_lock(self) -> Path:
        return self.root / MODELS_LOCK

    @property
    def datasets_lock(self) -> Path:
        return self.root / DATASETS_LOCK

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def cells(self) -> Path:
        return self.root / CELLS

    @property
    def charts(self) -> Path:
        return self.root / CHARTS

    def cell(self, server_id: str, cell_id: str) -> Path:
        return self.root / CELLS / server_id / f"{cell_id}.json"

    def cell_requests(self, server_id: str, cell_id: str) -> Path:
        return self.root / CELLS / server_id / f"{cell_id}{CELL_REQUESTS_SUFFIX}"

    def cell_files(self) -> list[Path]:
        """Every cell's result file, in a stable order."""
        return sorted(self.cells.glob("*/*.json")) if self.cells.is_dir() else []

    def cell_request_files(self) -> list[Path]:
        return sorted(self.cells.glob(f"*/*{CELL_REQUESTS_SUFFIX}")) if self.cells.is_dir() else []

    def loop(self, server_id: str, cell_id: str) -> Path:
        return self.root / LOOPS / server_id / f"{cell_id}.json"

    def archived(self, server_id: str, cell_id: str, key: str, folder: str = ARCHIVE) -> tuple[Path, Path]:
        """A measurement's copy in the archive: its cell JSON and its requests."""
        base = self.root / folder / server_id / cell_id
        return base / f"{key}.json", base / f"{key}{CELL_REQUESTS_SUFFIX}"

    def server(self, server_id: str) -> Path:
        return self.root / SERVERS / server_id

    def chart(self, name: str) -> Path:
        return self.root / CHARTS / f"{name}.png"


def history(results_root: str | Path) -> Path:
    """The results store of every run under ``results_root``."""
    return Path(results_root) / HISTORY
