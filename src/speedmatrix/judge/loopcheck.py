"""The loop stage of the DAG: judge every saved text of a cell, and the cell's status under a policy.

Per request: looped, suspected, onset (characters and tokens), period, repeats,
and whether the loop began after the model's natural end (when ``ignore_eos``
forced generation past it). Per cell: the loop fraction, the status under
the configured policy, throughput over the non-looping requests beside the
all-request figure, and whether the speculative acceptance can be trusted (a
drafter predicts a repeat easily: acceptance on looping output is inflated).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..core.settings import section_defaults
from ..core.status import Status
from ..measure import loops, precision
from ..workloads import get as workload
from . import lossless

# any: one looping request marks the cell looped (seed 002's rule); fraction: more than
# max_loop_fraction of the requests; flag_only: never changes the status, only reports
POLICIES = ("any", "fraction", "flag_only")
POLICY_KEYS = ("policy", "max_loop_fraction")


def onset_token(onset_char: int | None, chunk_chars: Any, chunk_tokens: Any) -> int | None:
    """Output tokens before the streamed event that holds character ``onset_char``."""
    if onset_char is None or chunk_chars is None or chunk_tokens is None or len(chunk_chars) == 0:
        return None
    chars = tokens = 0
    for c, t in zip(chunk_chars, chunk_tokens):  # numpy arrays when read back from parquet: plain ints out
        if chars + int(c) > onset_char:
            return tokens
        chars += int(c)
        tokens += int(t)
    return tokens


def _natural_end(row: Any) -> int | None:
    """Output tokens before the model's end-of-text token (seen when ignore_eos forced it on), or None."""
    v = getattr(row, "natural_end_char", None)
    if v is None or pd.isna(v):
        return None
    return onset_token(int(v), getattr(row, "chunk_chars", None), getattr(row, "chunk_tokens", None))


def judge_request(row: Any, thresholds: dict[str, Any]) -> dict[str, Any]:
    v = loops.detect(row.text or "", **thresholds)
    onset_tok = onset_token(v.onset_char, getattr(row, "chunk_chars", None), getattr(row, "chunk_tokens", None))
    natural = _natural_end(row)
    return {
        "request_index": int(row.request_index),
        "looped": v.looped,
        "loop_suspected": v.suspected,
        "loop_period_chars": v.period_chars,
        "loop_repeats": v.repeats,
        "loop_coverage_chars": v.coverage_chars,
        "loop_onset_char": v.onset_char,
        "loop_onset_token": onset_tok,
        "loop_normalized": v.normalized,
        # the model had ended (its end-of-text token, generated past because of ignore_eos) before looping
        "loop_after_natural_end": (None if natural is None or onset_tok is None or not v.suspected
                                   else onset_tok >= natural),
    }


def steps_of(chunk_tokens: Any, upto: int | None = None) -> tuple[int, int]:
    """(decode steps, tokens the drafter got accepted in them) from a stream's per-event token counts, over the
    events that end before ``upto`` output tokens (None: all). The first event follows prefill and carries
    one token: it is not a step of the drafter."""
    steps = accepted = seen = 0
    for k, t in enumerate(chunk_tokens if chunk_tokens is not None else []):
        seen += int(t)
        if upto is not None and seen > upto:
            break
        if k:
            steps += 1
            accepted += int(t) - 1
    return steps, accepted


def client_acceptance(requests: pd.DataFrame, per: list[dict[str, Any]], spec_tokens: int) -> dict[str, Any]:
    """Speculative acceptance seen by the client: each streamed event of a step carries 1 + the accepted
    draft tokens (per-event token counts: ``usage_per_chunk``), so the rate is accepted / (steps x k), over
    the whole output and over the output before each request's loop starts. A loop is easy to predict, so
    acceptance over looping output is inflated (ngram's most); the pre-loop figure is the drafter's own.
    None without speculation or without exact per-event counts. An API server that falls behind the engine
    can merge two steps into one event, which reads as more accepted tokens: the server's counters
    (``spec_decode_acceptance_rate``) stay the reference for the whole output."""
    reconciled = "tokens_reconciled" in requests and bool((requests["tokens_reconciled"] != 0).any())
    if not spec_tokens or requests.empty or reconciled:
        return {"spec_acceptance_client": None, "spec_acceptance_before_loop": None}
    onset = {p["request_index"]: p["loop_onset_token"] for p in per if p["looped"]}
    whole, before = [0, 0], [0, 0]
    for row in requests.itertuples(index=False):
        for acc, upto in ((whole, None), (before, onset.get(int(row.request_index)))):
            steps, accepted = steps_of(row.chunk_tokens, upto)
            acc[0] += steps
            acc[1] += accepted
    return {"spec_acceptance_client": whole[1] / (whole[0] * spec_tokens) if whole[0] else None,
            "spec_acceptance_before_loop": before[1] / (before[0] * spec_tokens) if before[0] else None}


def stability_verdict(cell: dict[str, Any], max_cv: float) -> str | None:
    """Why a cell is Unstable, or None: its stopping rule ended at its longest window or last repeat without the
    precision (speedmatrix.measure.precision), or its figure's CV over its repeats is above ``max_cv``."""
    res, spec = cell["result"], cell["cell"]
    if why := precision.unmet(res, spec.get("duration_s")):
        return why
    repeats = res.get("repeats_measured", spec.get("repeats", 1))  # a rule's cell may stop before its most
    if repeats < 2:
        return None
    figure = workload(spec["workload"]).stability_figure
    cv = res.get(f"{figure}_cv")
    if cv is None or cv <= max_cv:
        return None
    return f"{figure} CV {cv:.1%} over {repeats} repeats, limit {max_cv:.0%}"


def judge_cell(cell: dict[str, Any], requests: pd.DataFrame, settings: dict[str, Any],
               stability: dict[str, Any] | None = None, check: dict[str, Any] | None = None) -> dict[str, Any]:
    """Loop verdicts per request and the cell's status: over capacity (nothing sent), else lossy (``check``: its
    config's losslessness check found the cell's sampling setting Lossy; a client-bound measurement says so in
    the reason), else the measurement's own (client-bound), else looped (under the policy), else unstable
    (its stopping rule ended without its precision, or its repeats spread above ``stability.max_cv``), else
    valid."""
    settings = dict(section_defaults("loops", settings))
    policy = settings.pop("policy")
    max_fraction = float(settings.pop("max_loop_fraction"))
    if policy not in POLICIES:
        raise ValueError(f"unknown loop policy {policy!r}; known: {', '.join(POLICIES)}")
    per = [judge_request(row, settings) for row in requests.itertuples(index=False)]
    n = len(per)
    n_looped = sum(p["looped"] for p in per)
    fraction = n_looped / n if n else None
    suspected = sum(p["loop_suspected"] for p in per) / n if n else None
    res = cell["result"]
    status = res["status"]
    reason = res.get("status_reason")  # a measurement's own verdict (client_bound: why)
    # Lossy before any other verdict on a measurement: whatever else held, the output measured is not the target's
    fidelity = lossless.for_cell(check, cell["cell"].get("sampling"))
    if status != Status.OVER_CAPACITY and fidelity and fidelity["verdict"] == lossless.LOSSY:
        also = "" if status == Status.VALID else f"; the measurement also {status.replace('_', '-')}: {reason}"
        status, reason = Status.LOSSY, (f"speculative output is not the target's ({fidelity['label']}): "
                                   f"{fidelity['reason']}{also}")
    if status == Status.VALID and fraction and (policy == "any" or (policy == "fraction" and fraction > max_fraction)):
        status = Status.LOOPED
        reason = f"{n_looped} of {n} requests looped"
    max_cv = float(section_defaults("stability", stability)["max_cv"])
    unstable = stability_verdict(cell, max_cv) if status == Status.VALID else None
    if unstable:
        status, reason = Status.UNSTABLE, unstable
    # throughput over the requests that did not loop, beside the all-request figure
    # (the cell's own throughput, scaled by the share of its output tokens that came from non-looping requests)
    looped_ids = {p["request_index"] for p in per if p["looped"]}
    clean_tokens = int(requests.loc[~requests.request_index.isin(looped_ids), "output_tokens"].sum()) if n else 0
    all_tokens = int(requests["output_tokens"].sum()) if n else 0
    throughput = res.get("output_throughput")
    after_end = [p["loop_after_natural_end"] for p in per if p["loop_after_natural_end"] is not None]
    return {
        "server_id": cell["cell"]["server_id"],
        "cell_id": cell["cell"]["cell_id"],
        "thresholds": {**loops.DEFAULTS, **settings},
        "policy": policy,
        "max_loop_fraction": max_fraction if policy == "fraction" else None,
        "looped_requests": n_looped,
        "loop_fraction": fraction,
        "suspected_fraction": suspected,
        "cell_status": status,
        "status_reason": reason,
        "max_cv": max_cv,
        "output_throughput_non_looping": (throughput * clean_tokens / all_tokens
                                          if throughput is not None and all_tokens else None),
        "output_tokens_non_looping": clean_tokens if n else None,
        # acceptance counted over output that loops says little about the drafter
        "spec_acceptance_reliable": (None if res.get("spec_decode_acceptance_rate") is None
                                     else not n_looped),
        **(client_acceptance(requests, per, int(cell["server"].get("spec_tokens") or 0))
           if res.get("usage_per_chunk") else {"spec_acceptance_client": None, "spec_acceptance_before_loop": None}),
        "loops_after_natural_end": sum(after_end) if after_end else None,
        **lossless.cell_fields(fidelity),
        "requests": per,
    }
