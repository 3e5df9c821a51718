"""The run summary: every job of a run, done, failed (with its cause) or not run, grouped by cause.

Written at the end of every workflow run (``onsuccess`` and ``onerror`` in the
Snakefile) to ``results/<experiment>/run-summary.json`` and printed. The jobs
and their states are Snakemake's own record of the run (``jobs_of``: its DAG
and its scheduler's failed jobs), not a second list: whatever rule a job is
of, it is counted. A job's cause is the ``ERROR:`` line its log ends with
(speedmatrix.core.logs writes one for every failure it has a message for), else the
log's last line.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..core import atomic
from ..core.runfolder import RunFolder

# the same cause, whichever cell met it first: "failed to start earlier in this run" is "failed to start"
_SAME = [(re.compile(r" earlier in this run"), "")]


def cause_of(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for line in reversed(lines):
        text = re.sub(r"^\[\d\d:\d\d:\d\d(\.\d+)?\] ", "", line)
        if text.startswith("ERROR: "):
            cause = text[len("ERROR: "):]
            for pattern, repl in _SAME:
                cause = pattern.sub(repl, cause)
            return cause
    return re.sub(r"^\[\d\d:\d\d:\d\d(\.\d+)?\] ", "", lines[-1]) if lines else "(empty log)"


DONE, FAILED, NOT_RUN = "done", "failed", "not_run"


def job_name(rule: str, wildcards: dict[str, str]) -> str:
    """How the summary names a job: ``base/decode-ctx128-c1`` (a cell), ``loops base/decode-ctx128-c1``,
    ``base gate smoke``, ``model tiny-gemma4``, ``aggregate``."""
    if "cell_key" in wildcards:  # a cell: its rule is its kind
        return f"{wildcards['server_id']}/{rule}-{wildcards['cell_key']}"
    if "cell_id" in wildcards:
        return f"{rule} {wildcards['server_id']}/{wildcards['cell_id']}"
    if "server_id" in wildcards:
        return " ".join([wildcards["server_id"], rule, *(v for k, v in wildcards.items() if k != "server_id")])
    return " ".join([rule, *wildcards.values()])


def jobs_of(dag: Any, failed: Any, skip: tuple[str, ...] = ("all",)) -> list[tuple[str, str, Path | None]]:
    """(name, state, log) of every job in Snakemake's DAG of this run: failed (the scheduler's record;
    a failed group job's members), done (finished in this run, or up to date before it) or not run."""
    failed_keys = {(j.rule.name, tuple(j.wildcards.items())) for f in failed for j in getattr(f, "jobs", [f])}
    out = []
    for job in dag.jobs:
        if job.rule.name in skip:
            continue
        key = (job.rule.name, tuple(job.wildcards.items()))
        state = FAILED if key in failed_keys else DONE if dag.finished(job) or not dag.needrun(job) else NOT_RUN
        out.append((job_name(job.rule.name, dict(job.wildcards)), state, Path(job.log[0]) if job.log else None))
    return out


def summarize(results: Path, jobs: list[tuple[str, str, Path | None]], succeeded: bool = True) -> dict[str, Any]:
    """``jobs``: (name, state, log) for every job of the run (``jobs_of``); ``succeeded``: Snakemake's verdict
    (a run it calls failed with no failed job stopped outside any job: the summary says so)."""
    done, failed, not_run = [], defaultdict(list), []
    for name, state, log in jobs:
        if state == DONE:
            done.append(name)
        elif state == FAILED:
            cause = cause_of(log) if log is not None and log.exists() else "(failed before writing its log)"
            failed[cause].append(name)
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
        "succeeded": succeeded,
    }


def text(summary: dict[str, Any]) -> str:
    counts = f"{summary['done']} of {summary['jobs']} jobs done"
    if summary["failed"] or summary.get("succeeded", True):
        counts += f", {summary['failed']} failed"
    else:
        counts = "the run stopped on an error outside its jobs (Snakemake's log says which): " + counts
    out = [f"speedmatrix: {counts}, {summary['not_run']} not run ({summary['results']}/run-summary.json)"]
    for c in summary["causes"]:
        names = c["jobs"]
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        out.append(f"  {len(names)} failed: {c['cause']}  [{shown}]")
    if summary["not_run"] and summary["failed"]:
        out.append("  not run: jobs after a failure (a failed server config's cells, the aggregate and report)")
    return "\n".join(out)


def write(results: Path, jobs: list[tuple[str, str, Path | None]], succeeded: bool = True) -> dict[str, Any]:
    summary = summarize(results, jobs, succeeded)
    results.mkdir(parents=True, exist_ok=True)
    atomic.write_json(RunFolder(results).summary, summary)
    return summary
