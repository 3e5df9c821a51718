"""Is a speculative config lossless? The verdict on its outputs against its twin's, scored by the target.

Speculative decoding is a speed-up only if the output is what the target alone would give: for greedy
requests the same tokens, for sampled ones tokens from the target's distribution. The check's job
(speedmatrix.jobs.lossless) has the speculative config and its twin (the same model and arguments without
speculation) answer the same prompts with the same sampling settings and seeds, one request at a time, and
the twin scores every emitted token of both (the target's log-probability of it, from ``prompt_logprobs``).
This module judges what they wrote, nothing more:

- greedy (temperature 0, with or without a frequency penalty: both deterministic): the token ids must be
  identical. Where a request differs, the first differing position is judged by the target's scores there:
  the twin's token and the config's scored within ``tie_logprob_gap`` of each other (after the frequency
  penalty, which vLLM applies to the scores before it picks) is a near tie that batch numerics may legitimately
  break either way, said so; a wider gap is a loss.
- sampled: the share of emitted tokens the target scores below ``logprob_floor`` (a token it gives almost no
  chance, about 1 in 3,000 at -8), for the config against the twin's own share on the same prompts and
  seeds. The twin's share is what sampling from the target gives; *Lossy* where the config's exceeds it by
  more than ``max_excess_share``.

A cell of a config whose check found its sampling setting *Lossy* gets the status ``lossy`` (the loop stage,
speedmatrix.judge.loopcheck): its figures measure another distribution, and it is kept out of decisions as a
Looped cell is.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

LOSSLESS, LOSSY = "lossless", "lossy"


def setting_key(sampling: dict[str, Any] | None) -> str:
    """A sampling setting as a cell keeps it (canonical JSON; "" for greedy without a block)."""
    return json.dumps(sampling, sort_keys=True) if sampling else ""


def sampling_of(key: str) -> dict[str, Any]:
    """The sampling setting a key stands for ({} for greedy without a block)."""
    return json.loads(key) if key else {}


def is_greedy(sampling: dict[str, Any] | None) -> bool:
    """Temperature 0 (or no setting): the highest-scoring token every step, so the output is determined."""
    return not sampling or float(sampling.get("temperature", 0.0)) == 0.0


def label(sampling: dict[str, Any] | None) -> str:
    """A setting as a reader names it: greedy, greedy with a frequency penalty, or its temperature and top_p."""
    s = sampling or {}
    fp = f", frequency penalty {s['frequency_penalty']:g}" if "frequency_penalty" in s else ""
    if is_greedy(s):
        return "greedy" + fp
    top_p = f", top_p {s['top_p']:g}" if "top_p" in s else ""
    return f"temperature {s['temperature']:g}{top_p}{fp}"


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token sequences differ (one ending early counts), or None if equal."""
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


def penalised_gap(pos: int, ours: list[int], twins: list[int], our_scores: list[float], twin_scores: list[float],
                  frequency_penalty: float) -> float | None:
    """How much the target preferred the twin's token over the config's at their first difference ``pos``, on
    the scores greedy decoding picks from: log-prob minus the frequency penalty times the token's count in the
    output so far (the same prefix for both). None where one sequence ended there."""
    if pos >= len(ours) or pos >= len(twins):
        return None
    seen = Counter(ours[:pos])
    ours_score = our_scores[pos] - frequency_penalty * seen[ours[pos]]
    twin_score = twin_scores[pos] - frequency_penalty * seen[twins[pos]]
    return twin_score - ours_score


def greedy_verdict(ours: list[list[int]], twins: list[list[int]], our_scores: list[list[float]],
                   twin_scores: list[list[float]], frequency_penalty: float, tie_gap: float) -> dict[str, Any]:
    """Token identity, request by request; a difference that is a near tie on the target's scores is numerics."""
    diffs = []
    for i, (a, b) in enumerate(zip(ours, twins)):
        pos = first_difference(a, b)
        if pos is None:
            continue
        gap = penalised_gap(pos, a, b, our_scores[i], twin_scores[i], frequency_penalty)
        diffs.append({"request": i, "position": pos, "token": a[pos] if pos < len(a) else None,
                      "twin_token": b[pos] if pos < len(b) else None,
                      "gap": None if gap is None else round(gap, 6),
                      "near_tie": gap is not None and abs(gap) <= tie_gap})
    n = len(ours)
    lost = [d for d in diffs if not d["near_tie"]]
    ties = len(diffs) - len(lost)
    out = {"requests": n, "identical": n - len(diffs), "identical_share": (n - len(diffs)) / n if n else None,
           "near_ties": ties, "differences": diffs[:10]}
    if lost:
        d = lost[0]
        gap = "the config's output ended there" if d["gap"] is None else (
            f"the target scored the twin's token {d['gap']:.3g} above the config's")
        out.update(verdict=LOSSY, reason=(f"{len(lost)} of {n} greedy outputs differ from the twin's beyond a near "
                                          f"tie; the first at request {d['request']}, token {d['position']} ({gap})"))
    else:
        tie_note = (f"; {ties} differ at a near tie of the target's scores (within {tie_gap:g}: batch numerics)"
                    if ties else "")
        out.update(verdict=LOSSLESS, reason=f"{n - ties} of {n} greedy outputs token-identical to the twin's{tie_note}")
    return out


def floor_figures(our_scores: list[list[float]], twin_scores: list[list[float]], floor: float) -> dict[str, Any]:
    """Tokens scored, the share the target scores below ``floor`` and the mean target log-prob, the config's and
    the twin's."""
    out: dict[str, Any] = {}
    for prefix, scores in (("", our_scores), ("twin_", twin_scores)):
        flat = [x for seq in scores for x in seq]
        out[f"{prefix}tokens"] = len(flat)
        out[f"{prefix}share_below_floor"] = sum(x < floor for x in flat) / len(flat) if flat else None
        out[f"{prefix}mean_logprob"] = sum(flat) / len(flat) if flat else None
    return out


def sampled_verdict(our_scores: list[list[float]], twin_scores: list[list[float]], floor: float,
                    max_excess: float) -> dict[str, Any]:
    """The config's share of emitted tokens the target scores below ``floor`` against the twin's own."""
    out = floor_figures(our_scores, twin_scores, floor)
    share, twin_share = out["share_below_floor"], out["twin_share_below_floor"]
    if share is None or twin_share is None:
        return {**out, "verdict": None, "reason": "no output to judge"}
    excess = share - twin_share
    said = (f"{share:.1%} of the config's {out['tokens']:,} tokens score below {floor:g} under the target, against "
            f"{twin_share:.1%} of the twin's {out['twin_tokens']:,}")
    if excess > max_excess:
        return {**out, "excess_share": excess, "verdict": LOSSY,
                "reason": f"{said}: {excess:.1%} more than sampling from the target gives (limit {max_excess:.0%})"}
    return {**out, "excess_share": excess, "verdict": LOSSLESS, "reason": f"{said} (limit {max_excess:.0%} more)"}


def to_score(sampling: dict[str, Any] | None, ours: list[list[int]], twins: list[list[int]]) -> list[int]:
    """The requests whose tokens the twin must score: every one where sampled; where greedy, only those whose
    outputs differ (the gap at their first difference). Identical greedy outputs need no score, so a server
    that cannot give ``prompt_logprobs`` still checks greedy settings."""
    if not is_greedy(sampling):
        return list(range(len(ours)))
    return [i for i, (a, b) in enumerate(zip(ours, twins)) if a != b]


def judge(sampling: dict[str, Any] | None, ours: list[list[int]], twins: list[list[int]],
          our_scores: list[list[float]], twin_scores: list[list[float]], settings: dict[str, Any]) -> dict[str, Any]:
    """One sampling setting's verdict, greedy or sampled, with its figures. The scores are per request, aligned
    with the outputs; a request :func:`to_score` left out has an empty list."""
    head = {"setting": setting_key(sampling), "label": label(sampling), "greedy": is_greedy(sampling),
            "tokens": sum(map(len, ours)), "twin_tokens": sum(map(len, twins))}
    if is_greedy(sampling):
        fp = float((sampling or {}).get("frequency_penalty", 0.0))
        return {**head, **greedy_verdict(ours, twins, our_scores, twin_scores, fp, float(settings["tie_logprob_gap"]))}
    same = sum(a == b for a, b in zip(ours, twins))
    out = sampled_verdict(our_scores, twin_scores, float(settings["logprob_floor"]),
                          float(settings["max_excess_share"]))
    # a seeded sample the same token for token as the twin's says the speculative sampler drew what the target
    # alone draws: where every output is, the check is exact, not a share test
    identity = {"requests": len(ours), "identical": same, "identical_share": same / len(ours) if ours else None}
    if ours and out.get("verdict"):
        out["reason"] += f"; {same} of {len(ours)} seeded outputs token-identical to the twin's"
    return {**head, **identity, **out}


def for_cell(check: dict[str, Any] | None, sampling: dict[str, Any] | None) -> dict[str, Any] | None:
    """The verdict of a check document (``lossless/<twin>/verdict-<config>.json``) for a cell's sampling setting,
    or None where the check has none (no check, or a setting it did not judge)."""
    if not check:
        return None
    key = setting_key(sampling)
    return next((v for v in check.get("settings", []) if v["setting"] == key), None)


def cell_fields(verdict: dict[str, Any] | None) -> dict[str, Any]:
    """The matrix's columns of a cell's check (the loop stage writes them beside its status)."""
    v = verdict or {}
    return {"lossless_verdict": v.get("verdict"), "lossless_setting": v.get("label"),
            "lossless_reason": v.get("reason"),
            "lossless_identical_share": v.get("identical_share"),
            "lossless_share_below_floor": v.get("share_below_floor"),
            "lossless_twin_share_below_floor": v.get("twin_share_below_floor")}
