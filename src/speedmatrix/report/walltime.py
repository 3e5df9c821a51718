"""Where a finished run's wall time went: server start-ups, measurement windows, and the rest (overhead).

    speedmatrix walltime results/<experiment> [--out walltime.json]

Reads only what every run leaves behind: each job's log under ``logs/`` (every line starts with the time of
day, ``[HH:MM:SS.mmm]``, or ``[HH:MM:SS]`` in a run of an earlier version), ``servers/<id>/starts.jsonl``
(each start's ``startup_seconds``) and the cell JSONs
(``measured_s``: the cell's measurement windows, repeats summed, as each kind records it: a prefix-cache
cell's warm pass only, a search's every step; prefill cells record none, so their requests count as overhead).
Wall time is the first log line to the last (one-second resolution; a run past midnight is unwrapped). Inside
the jobs that use a server (the cells, the losslessness check's outputs and scores, the quality gates: a server
starts inside the first of them that needs it), the time outside server start-ups and windows is prompt
preparation, waits for the server to drain, counters, writing, the check's and the gates' requests; outside them,
the reference rounds (other clients measuring the same cells: a check the experiment asked for, not the
pipeline's overhead) and the pin, models, loop verdicts, aggregation and report jobs; what no job's log covers is
the scheduler's own time and the idle gaps between jobs.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path

from ..core.atomic import read_json, read_jsonl
from ..core.status import Status

STAMP = re.compile(r"^\[(\d\d):(\d\d):(\d\d)(\.\d+)?\]")


def resolution(path: Path) -> float:
    """The seconds a log's stamps resolve: 0.001 (milliseconds), or 1 in a run of an earlier version."""
    for line in path.read_text(errors="replace").splitlines():
        m = STAMP.match(line)
        if m:
            return 0.001 if m.group(4) else 1.0
    return 1.0


def log_span(path: Path) -> tuple[float, float] | None:
    """(first, last) second of the day that a job's log lines carry; None for a log without stamps."""
    secs = []
    for line in path.read_text(errors="replace").splitlines():
        m = STAMP.match(line)
        if m:
            h, mi, s = (int(x) for x in m.groups()[:3])
            secs.append(h * 3600 + mi * 60 + s + (float(m.group(4)) if m.group(4) else 0.0))
    if not secs:
        return None
    # a job that ran past midnight: later stamps are smaller than earlier ones
    out = [secs[0]]
    for s in secs[1:]:
        while s < out[-1] - 43200:
            s += 86400
        out.append(s)
    return out[0], max(out)


def covered(spans: list[tuple[float, float]], res: float = 1.0) -> float:
    """Seconds covered by the union of [a, b] spans, each to the stamps' resolution ``res`` (a job whose
    whole-second stamps are all one second covers 1 s)."""
    total = _union([(a, b + res) for a, b in spans])
    return float(round(total)) if res >= 1 else round(total, 3)


def _epoch(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z").timestamp()


def _union(spans: list[tuple[float, float]]) -> float:
    total, cur = 0.0, None
    for a, b in sorted(spans):
        if cur is None or a > cur[1]:
            if cur:
                total += cur[1] - cur[0]
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    return total + (cur[1] - cur[0] if cur else 0.0)


def _cell_figures(run: Path) -> tuple[int, float, float, bool, list[tuple[float, float]], int]:
    """From the cell JSONs: how many cells, their windows' seconds, the seconds their kinds sent requests
    (``requests_s``; whether every sent cell says), each window's span where it has a start time, and how many
    windows have none."""
    cells, windows, busy, unknown = 0, 0.0, [], 0
    sending, sending_known = 0.0, True
    for f in sorted(run.glob("cells/*/*.json")):
        res = read_json(f).get("result", {})
        windows += float(res.get("measured_s") or 0.0)
        cells += 1
        if res.get("status") != Status.OVER_CAPACITY:
            sending_known &= res.get("requests_s") is not None
            sending += max(float(res.get("requests_s") or 0.0), float(res.get("measured_s") or 0.0))
        if res.get("measured_s"):
            if res.get("started_at"):
                t = _epoch(res["started_at"])
                busy.append((t, t + float(res["measured_s"])))
            else:
                unknown += 1
    return cells, windows, sending, sending_known, busy, unknown


# the jobs that use a server (their logs' folders)
SERVER_JOBS = ("cells/", "lossless/", "gates/")
SERVER_WORK = ("server jobs outside windows and start-ups (cells' prompts, drain waits, counters, writing; the "
               "losslessness check's outputs and scores; quality gates)")


def analyse(run: Path) -> dict:
    spans, stamp_res = {}, 0.001
    for log in sorted((run / "logs").rglob("*.log")):
        span = log_span(log)
        if span:
            spans[str(log.relative_to(run / "logs"))] = span
            stamp_res = max(stamp_res, resolution(log))  # whole seconds where any job's log has them
    if not spans:
        raise SystemExit(f"{run}: no job log with time stamps under logs/ (is it a finished run's folder?)")
    # put every span on one axis: in a run that crossed midnight (stamps more than 12 h apart), the jobs that
    # started after it have small stamps and move a day on
    starts = [a for a, _ in spans.values()]
    shift = 86400 if max(starts) - min(starts) > 43200 else 0
    axis = {k: (a + shift, b + shift) if a < 43200 else (a, b) for k, (a, b) in spans.items()}
    start, end = min(a for a, _ in axis.values()), max(b for _, b in axis.values())
    wall = end - start
    starts = [s for f in sorted(run.glob("servers/*/starts.jsonl")) for s in read_jsonl(f)]
    startups = [s["startup_seconds"] for s in starts]
    cells, windows, sending, sending_known, busy, unknown = _cell_figures(run)
    # where the run knows when each start-up and window was (a GPU pool runs them side by side), the busy
    # time is their union: what ran at the same time is counted once
    for s in starts:
        if s.get("at"):
            t = _epoch(s["at"])
            busy.append((t - float(s["startup_seconds"]), t))
        else:
            unknown += 1
    busy_s = _union(busy) if busy and not unknown else None
    # jobs can overlap (several loop verdicts at once; on a cluster, cells of other configs): count time once
    # the jobs that use a server: a server starts inside the first of them that needs it (a cell, or the
    # losslessness check's outputs, which come before the cells, or a quality gate)
    server_jobs = covered([v for k, v in axis.items() if k.startswith(SERVER_JOBS)], stamp_res)
    # the reference rule's rounds measure too (speedmatrix and other clients on the same server): time a
    # reference job ran while no server job did is theirs, not overhead
    measuring = covered([v for k, v in axis.items() if k.startswith((*SERVER_JOBS, "reference/"))], stamp_res)
    reference = measuring - server_jobs
    any_job = covered(list(axis.values()), stamp_res)
    other_jobs = any_job - measuring  # time some other job ran while no server was used
    startup_s = float(sum(startups))
    in_cells = max(0.0, server_jobs - windows - startup_s)
    rest = max(0.0, wall + stamp_res - any_job)
    parts = {
        "server start-ups": startup_s,
        "measurement windows": windows,
        SERVER_WORK: in_cells,
        "reference rounds while no cell measured (other clients on the same server)": reference,
        "other jobs while no server was used (pin, models, loops, aggregate, report)": other_jobs,
        "between jobs (scheduler, idle)": rest,
    }
    # a cell job's own work (prompts, drain waits, counters, writing) apart from the requests its kind sent outside
    # its window (a prefix-cache cell's cold pass, a prefill cell's requests): known where every cell says how long
    # its kind sent requests (``requests_s``; runs of earlier versions did not)
    own = max(0.0, server_jobs - startup_s - sending) if sending_known and cells else None
    overhead = wall - (busy_s if busy_s is not None else startup_s + windows) - reference
    return {
        "run": str(run),
        "started": (datetime(2000, 1, 1) + timedelta(seconds=start)).strftime("%H:%M:%S"),
        "wall_s": wall,
        "cells": cells,
        "server_starts": len(startups),
        "parts_s": parts,
        # the union of start-ups and windows (None where a start or window has no time stamp)
        "busy_s": busy_s,
        "side_by_side_s": (startup_s + windows - busy_s) if busy_s is not None else None,
        "reference_s": reference,
        "cell_jobs_requests_outside_windows_s": None if own is None else max(0.0, in_cells - own),
        "cell_jobs_own_s": own,
        "cell_jobs_own_s_per_cell": None if own is None else own / cells,
        "overhead_s": overhead,
        "overhead_fraction": overhead / wall if wall else None,
        "note": "one-second log stamps: each part is good to about a second a job",
    }


def text(got: dict) -> str:
    """The split as lines: wall time, each part with its share, the overhead."""
    out = [f"{got['run']}: wall {got['wall_s']:.0f} s from {got['started']}, {got['cells']} cells, "
           f"{got['server_starts']} server start(s)"]
    for name, secs in got["parts_s"].items():
        share = secs / got["wall_s"] * 100 if got["wall_s"] else 0.0
        out.append(f"  {secs:8.1f} s  {share:5.1f} %  {name}")
    if got.get("cell_jobs_own_s") is not None:
        out.append(f"    of which requests sent outside windows (cold passes, prefill): "
                   f"{got['cell_jobs_requests_outside_windows_s']:.1f} s; the jobs' own work: "
                   f"{got['cell_jobs_own_s']:.1f} s, {got['cell_jobs_own_s_per_cell']:.2f} s a cell")
    if (got["side_by_side_s"] or 0) > 0.5:
        out.append(f"  start-ups and windows side by side (counted once below): {got['side_by_side_s']:.1f} s")
    out.append(f"overhead (wall - start-ups - windows - reference rounds): {got['overhead_s']:.1f} s, "
               f"{(got['overhead_fraction'] or 0) * 100:.1f} % of wall")
    return "\n".join(out)
