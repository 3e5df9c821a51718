"""The loop stage of the DAG: judge every saved text of a cell, and the cell's status under a policy."""

from __future__ import annotations

from typing import Any

import pandas as pd

from . import loops

POLICIES = ("any", "flag_only")


def judge_cell(cell: dict[str, Any], requests: pd.DataFrame, settings: dict[str, Any]) -> dict[str, Any]:
    settings = dict(settings)
    policy = settings.pop("policy", "any")
    if policy not in POLICIES:
        raise ValueError(f"unknown loop policy {policy!r}; known: {', '.join(POLICIES)}")
    per = []
    for row in requests.itertuples(index=False):
        v = loops.detect(row.text or "", **settings)
        per.append({
            "request_index": int(row.request_index),
            "looped": v.looped,
            "loop_suspected": v.suspected,
            "loop_period_chars": v.period_chars,
            "loop_repeats": v.repeats,
            "loop_coverage_chars": v.coverage_chars,
            "loop_onset_char": v.onset_char,
        })
    n = len(per)
    fraction = sum(p["looped"] for p in per) / n if n else None
    suspected = sum(p["loop_suspected"] for p in per) / n if n else None
    status = cell["result"]["status"]
    if status == "valid" and policy == "any" and fraction:
        status = "looped"
    return {
        "server_id": cell["cell"]["server_id"],
        "cell_id": cell["cell"]["cell_id"],
        "thresholds": {**loops.DEFAULTS, **settings},
        "policy": policy,
        "loop_fraction": fraction,
        "suspected_fraction": suspected,
        "cell_status": status,
        "requests": per,
    }
