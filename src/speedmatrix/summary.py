"""The run summary: every job of a run, done, failed (with its cause) or not run, grouped by cause.

Written at the end of every workflow run (``onsuccess`` and ``onerror`` in the
Snakefile) to ``results/<experiment>/run-summary.json`` and printed. A job's
cause is the ``ERROR:`` line its log ends with (speedmatrix.logs writes one for
every failure it has a message for), else the log's last line.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from . import atomic

# the same cause, whichever cell met it first: "failed to start earlier in this run" is "failed to start"
_SAME = [(re.compile(r" earlier in this run"), "")]


def cause_of(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for line in reversed(lines):
        text = re.sub(r"^\[\d\d:\d\d:\d\d\] ", "", line)
        if text.startswith("ERROR: "):
            cause = text[len("ERROR: "):]
            for pattern, repl in _SAME:
                cause = pattern.sub(repl, cause)
            return cause
    return re.sub(r"^\[\d\d:\d\d:\d\d\] ", "", lines[-1]) if lines else "(empty log)"


def summarize(results: Path, jobs: list[tuple[str, Path, Path]]) -> dict[str, Any]:
    """``jobs``: (name, its output, its log) for every measuring job of the run."""
    done, failed, not_run = [], defaultdict(list), []
    for name, output, log in jobs:
        if output.exists():
            done.append(name)
        elif log.exists():
            failed[cause_of(log)].append(name)
        else:
            not_run.append(name)
    return {
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "results": str(results),
        "jobs": len(jobs),
        "done": len(done),
        "failed": sum(len(v) for v in failed.values()),
        "not_run": len(not_run),
        "causes": [{"cause": c, "jobs": sorted(names)} for c, names in
                   sorted(failed.items(), key=lambda kv: -len(kv[1]))],
        "not_run_jobs": sorted(not_run),
    }


def text(summary: dict[str, Any]) -> str:
    out = [f"speedmatrix: {summary['done']} of {summary['jobs']} jobs done, {summary['failed']} failed, "
           f"{summary['not_run']} not run ({summary['results']}/run-summary.json)"]
    for c in summary["causes"]:
        names = c["jobs"]
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        out.append(f"  {len(names)} failed: {c['cause']}  [{shown}]")
    if summary["not_run"] and summary["failed"]:
        out.append("  not run: jobs after a failure (a failed server config's cells, the aggregate and report)")
    return "\n".join(out)


def write(results: Path, jobs: list[tuple[str, Path, Path]]) -> dict[str, Any]:
    summary = summarize(results, jobs)
    results.mkdir(parents=True, exist_ok=True)
    atomic.write_json(results / "run-summary.json", summary)
    return summary
