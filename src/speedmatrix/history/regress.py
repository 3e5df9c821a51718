"""The regression verdict between two runs: per cell and figure, faster / slower / no change / inconclusive / not
comparable.

Method (docs/decisions/0022-regression-verdicts.md): each figure is computed from the cell's requests (those its
window counted, without error and outside warm-up phases), and a bootstrap over those requests, resampled within
each repeat and independently in each run, gives a 95 % percentile interval of NEW's change against BASE. A
change is a verdict only when that interval excludes zero *and* the change is at least the minimum effect: the
user's (``min_effect``), else the cell's own noise (``noise_multiple`` times the larger of the two runs' noise:
the spread between the cell's repeats where it has several, and its own bootstrap interval's half-width). Cells
measured differently (another server config, cell, prompt set, window or client setting: ``basis_sha256``), in a
status with no figure (looped, over capacity, client-bound, lossy, failed) or whose load is the run's own result
(a search) are *not comparable* and never compared. *No change* only where the interval holds zero and stays
within the minimum effect; a change under the minimum effect, or an interval reaching beyond it, is
*inconclusive* (the cell's noise, or its few requests, cannot tell).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .. import workloads
from ..core.errors import StoreError
from ..core.status import USABLE, Status
from ..measure import precision, stats
from .gate import SEVERITY, Outcome, first

COMPARABLE_STATUSES = USABLE
# a cell in these statuses was not the server's doing: its figure is the client's (a measurement problem)
MEASUREMENT_STATUSES = (Status.CLIENT_BOUND,)
FASTER, SLOWER, SAME, NOT_COMPARABLE = "faster", "slower", "no change", "not comparable"
# neither a change nor none: a change the cell's noise hides, or an interval wider than the minimum effect
INCONCLUSIVE = "inconclusive"
# a verdict that is neither faster nor slower (the report's "within noise")
NO_VERDICT = (SAME, INCONCLUSIVE)


@dataclass(frozen=True)
class Figure:
    """A figure the verdict judges: its name, label, which way is better, how it comes from a request (``per``:
    ``ttft_ms``, ``tpot_ms``, ``request_tok_s`` or ``served_tok_s``) and over the requests (``q``: that percentile;
    none: the median of a latency, the mean of a rate)."""

    name: str
    label: str
    higher_is_better: bool
    per: str = ""
    q: float | None = None

    def values(self, reqs: pd.DataFrame) -> np.ndarray:
        per = self.per or self.name
        if per == "ttft_ms":
            return reqs["ttft_ms"].to_numpy(dtype=float)
        if per == "served_tok_s":
            return stats.served_tok_s(reqs["start_s"], reqs["end_s"], reqs["output_tokens"])
        per_request = stats.tpot_ms if per == "tpot_ms" else stats.request_tok_s  # the cells' definitions
        return per_request(reqs["start_s"], reqs["end_s"], reqs["ttft_ms"], reqs["output_tokens"])

    def statistic(self, values: np.ndarray, axis: int = -1) -> np.ndarray:
        # the values are finite (judge_figure keeps those): numpy's partition-based statistics, fast on the
        # bootstrap's (resamples x requests) array
        if self.q is not None:  # a tail latency, interpolated as every pNN figure of a cell (stats.percentile)
            return np.percentile(values, self.q, axis=axis)
        # latencies: the median (the matrix's); a request's rate: the mean (tok/s at a load is the sum of rates)
        return np.median(values, axis=axis) if not self.higher_is_better else np.mean(values, axis=axis)

    def min_requests(self) -> int:
        """The requests a side needs for a verdict on the figure: MIN_REQUESTS, and for a percentile as many as its
        distribution-free 95 % interval needs (a p99 of fifty requests is their largest)."""
        return MIN_REQUESTS if self.q is None else max(MIN_REQUESTS, _percentile_samples(self.q))


@functools.cache
def _percentile_samples(q: float) -> int:
    return precision.samples_for_percentile(q / 100, 0.95)


# a request's tokens over its whole time: at the cell's fixed load its mean moves as the cell's total output tok/s
SERVED_TOK_S = Figure("served_tok_s", "output tok/s per request, first token included (total at the load)", True)
FIGURES = [Figure("request_tok_s", "output tok/s per request", True), SERVED_TOK_S,
           Figure("ttft_ms", "median TTFT", False), Figure("tpot_ms", "median TPOT", False),
           *(Figure(f"p{q}_{per}", f"p{q} {per[:4].upper()}", False, per, q)
             for per in ("ttft_ms", "tpot_ms") for q in (95, 99))]

# what --min-effect may call a figure, beside its own name
ALIASES = {"output_tok_s": "request_tok_s", "tok_s": "request_tok_s", "total_tok_s": "served_tok_s",
           "ttft": "ttft_ms", "tpot": "tpot_ms",
           **{f"p{q}_{x}": f"p{q}_{x}_ms" for q in (95, 99) for x in ("ttft", "tpot")}}


def parse_min_effect(text: str | None) -> float | dict[str, float] | None:
    """``--min-effect``: one percentage for every figure ("10", "10%") or one per figure
    ("output_tok_s=5%,ttft=10%"; a figure not named keeps its noise-derived minimum), as fractions."""
    if text is None or not str(text).strip():
        return None

    def pct(value: str, what: str) -> float:
        try:
            v = float(value.strip().rstrip("%").strip())
        except ValueError:
            raise StoreError(f"--min-effect {text!r}: {what} {value.strip()!r} is not a percentage (e.g. 5 or 5%)") \
                from None
        if not 0 < v < 1000:
            raise StoreError(f"--min-effect {text!r}: {what} {v:g} % is outside 0-1000 %")
        return v / 100

    if "=" not in text:
        return pct(text, "the value")
    out: dict[str, float] = {}
    names = {f.name for f in FIGURES}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        figure = ALIASES.get(name.strip(), name.strip())
        if figure not in names:
            raise StoreError(f"--min-effect {text!r}: {name.strip()!r} is not a judged figure (one of "
                             f"{', '.join(sorted(names | set(ALIASES)))})")
        out[figure] = pct(value, figure)
    return out


MIN_REQUESTS = 5  # fewer samples on a side than this: no verdict on the figure
RESAMPLES = 2000
NO_SUCH_FIGURE = "no request of either run has this figure"
NO_REQUESTS = "neither run kept the cell's requests (a run kept with its matrix only): nothing to judge"


def unshown(table: pd.DataFrame) -> pd.Series:
    """The rows a page leaves to the CSV and JSON: figures the cell does not have, and tail percentiles of cells
    with fewer requests than their interval needs (not comparable, not a problem)."""
    if "figure" not in table:
        return pd.Series(False, index=table.index)
    tail = table["figure"].isin([f.name for f in FIGURES if f.q is not None])
    return (table["verdict"] == NOT_COMPARABLE) & ~table["measurement"].astype(bool) & table["figure"].notna() & (
        tail | (table["reason"] == NO_SUCH_FIGURE))


def counted(reqs: pd.DataFrame) -> pd.DataFrame:
    """The requests a cell's figures are made of: counted in the window, no error, not a warm-up (a requests file
    written before a column was recorded: every request counted, in one repeat)."""
    reqs = reqs.assign(**{c: v for c, v in (("counted", True), ("phase", ""), ("repeat", 1)) if c not in reqs})
    keep = reqs["counted"].fillna(True).astype(bool) & reqs["error"].isna()
    keep &= ~reqs["phase"].fillna("").astype(str).str.contains("warmup")
    return reqs[keep]


def streamed(cell: pd.Series) -> bool:
    """Whether a cell's tokens came as the server made them (not held back and sent in bursts, as vLLM for the CPU
    can): its ``delivery`` in the matrix (none recorded, e.g. one-token prefill cells: as made)."""
    delivery = cell.get("delivery")
    return delivery is None or pd.isna(delivery) or delivery == "streamed"


def _requests(n: int) -> str:
    return f"{int(n)} request{'' if int(n) == 1 else 's'}"


def _seed(*parts: str) -> int:
    return int(hashlib.sha256("/".join(parts).encode()).hexdigest()[:8], 16)


def _boot(fig: Figure, values: np.ndarray, strata: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """RESAMPLES bootstrap statistics: requests drawn with replacement within each repeat."""
    picks = []
    for s in np.unique(strata):
        idx = np.flatnonzero(strata == s)
        picks.append(idx[rng.integers(0, len(idx), size=(RESAMPLES, len(idx)))])
    return fig.statistic(values[np.concatenate(picks, axis=1)], axis=1)


def _repeat_cv(fig: Figure, values: np.ndarray, strata: np.ndarray) -> float:
    """The figure's spread between the cell's repeats (stats.interval's CV; 0 with one repeat)."""
    per = [fig.statistic(values[strata == s]) for s in np.unique(strata)]
    return stats.interval([p for p in per if np.isfinite(p)])["cv"] or 0.0


def judge_figure(fig: Figure, base: pd.DataFrame, new: pd.DataFrame, key: str, min_effect: float | None,
                 noise_multiple: float, siblings: tuple[list[pd.DataFrame], list[pd.DataFrame]] = ([], []),
                 streamed: bool = True, level: float = 0.95, min_runs: int = 0) -> dict[str, Any]:
    """One figure of one cell: the change, its interval, the minimum effect used and the verdict. ``siblings``: the
    cell's requests in other runs of BASE's runtime and of NEW's (the run-to-run spread of each side);
    ``streamed``: whether both runs' tokens came as made (latency figures are judged only then); ``level``: the
    run-to-run part's prediction level; ``min_runs``: without a user's minimum effect, no faster or slower verdict
    until BASE's side has this many runs with the figure (BASE's own counted), the run-to-run spread unknown."""
    out: dict[str, Any] = {"figure": fig.name}
    if not fig.higher_is_better and not streamed:
        return {**out, "verdict": NOT_COMPARABLE,
                "reason": "tokens came in bursts: a request's token times are not the server's"}
    vb, vn = fig.values(base), fig.values(new)
    ob, on = np.isfinite(vb), np.isfinite(vn)
    need = fig.min_requests()
    if base.empty and new.empty:  # a run kept without its requests (its matrix only)
        return {**out, "verdict": NOT_COMPARABLE, "reason": NO_REQUESTS}
    if not ob.any() and not on.any():  # the figure is not the cell's (one output token: no TPOT)
        return {**out, "verdict": NOT_COMPARABLE, "reason": NO_SUCH_FIGURE}
    if ob.sum() < need or on.sum() < need:
        # the new run measured fewer than the base and too few: a measurement problem (a window cut short, requests
        # lost); both too few (a cell that sends three requests, a tail percentile of a small cell): the cell's
        # design, no verdict and no problem
        dropped = fig.q is None and on.sum() < need <= ob.sum()
        tail = "" if fig.q is None else f" (its {fig.q:g}th percentile's 95 % interval)"
        return {**out, "verdict": NOT_COMPARABLE, "measurement": bool(dropped),
                "reason": (f"the new run has {_requests(on.sum())} with this figure, the base {int(ob.sum())}: "
                           f"under the {need} a verdict needs" if dropped else
                           f"{_requests(min(ob.sum(), on.sum()))} with this figure: a verdict needs {need}{tail}")}
    vb, sb = vb[ob], base["repeat"].fillna(1).to_numpy()[ob]
    vn, sn = vn[on], new["repeat"].fillna(1).to_numpy()[on]
    point_b, point_n = float(fig.statistic(vb)), float(fig.statistic(vn))
    rng = np.random.default_rng(_seed(key, fig.name))
    boot_b, boot_n = _boot(fig, vb, sb, rng), _boot(fig, vn, sn, rng)
    change = point_n / point_b - 1
    low, high = (float(x) for x in np.nanpercentile(boot_n / boot_b - 1, [2.5, 97.5]))
    noise = max(_repeat_cv(fig, vb, sb), _repeat_cv(fig, vn, sn),
                *(float(np.nanpercentile(b, 97.5) - np.nanpercentile(b, 2.5)) / 2 / p
                  for b, p in ((boot_b, point_b), (boot_n, point_n))))
    # between runs: the spread of the figure over the other stored runs of each side's runtime, BASE's own run with
    # them; never NEW's own run, whose difference is what is judged (a night slower than the nights before it would
    # otherwise widen its own noise and hide itself). NEW is one more draw from that spread: the change it may show
    # by chance is a prediction interval's (Student's t over the runs seen, times sqrt(1 + 1/m)), not twice the
    # spread, which with two or three runs stored fired on one cell in three of a release against itself
    # (bench/results/noise-store/)
    sides = [[point_b] + _run_points(fig, siblings[0], need), _run_points(fig, siblings[1], need)]
    spreads = [stats.interval(points)["cv"] or 0.0 for points in sides]
    run_noise = max(spreads)
    run_effect = max(prediction_factor(len(points), level) * cv for points, cv in zip(sides, spreads))
    runs_seen = len(sides[0]) - 1 + len(sides[1])
    threshold_noise = max(noise_multiple * noise, run_effect)
    noise = max(noise, run_noise)
    threshold = min_effect if min_effect is not None else threshold_noise
    better = change > 0 if fig.higher_is_better else change < 0
    if (low > 0 or high < 0) and abs(change) >= threshold:
        verdict, reason = (FASTER if better else SLOWER), ""
    elif low <= 0 <= high and max(-low, high) <= threshold:
        verdict, reason = SAME, "the interval holds no change and stays within the minimum effect"
    elif low <= 0 <= high:
        verdict = INCONCLUSIVE
        reason = f"the interval reaches beyond the minimum effect ({threshold:.1%}): too few requests to tell"
    else:
        verdict = INCONCLUSIVE
        reason = f"a change smaller than the minimum effect ({threshold:.1%}): the cell's noise hides it"
    if verdict in (FASTER, SLOWER) and min_effect is None and len(sides[0]) < min_runs:
        verdict, said = INCONCLUSIVE, verdict
        reason = (f"{said} {abs(change):.1%}, but the store holds {len(sides[0])} run(s) of the base's "
                  f"runtime on this kind of machine with the figure, the base's among them: the run-to-run spread "
                  f"needs {min_runs} (--min-runs)")
    return {**out, "base": point_b, "new": point_n, "change": change, "ci_low": low, "ci_high": high,
            "noise": noise, "run_noise": run_noise if runs_seen else None, "other_runs": runs_seen,
            "min_effect": threshold, "verdict": verdict, "reason": reason,
            "base_requests": int(ob.sum()), "new_requests": int(on.sum())}


def _run_points(fig: Figure, runs: list[pd.DataFrame], need: int) -> list[float]:
    """The figure in each of ``runs`` (a cell's requests in other stored runs) that has the requests it needs."""
    return [float(fig.statistic(v[np.isfinite(v)])) for v in (fig.values(o) for o in runs)
            if np.isfinite(v).sum() >= need]


@functools.cache
def prediction_factor(runs: int, level: float = 0.95) -> float:
    """How many times the run-to-run spread (a CV over ``runs`` runs) one more run may differ from their mean by
    chance at ``level``: Student's t with runs - 1 degrees of freedom times sqrt(1 + 1/runs); 0 under two runs (no
    spread known)."""
    if runs < 2:
        return 0.0
    return precision.t_quantile(1 - (1 - level) / 2, runs - 1) * (1 + 1 / runs) ** 0.5


def differing(b: pd.Series, n: pd.Series) -> list[str]:
    """What two runs' cell measured differently: the cell's or the client's settings that both recorded and that
    differ (a setting one run did not record, because it predates it, is not a difference)."""
    out = []
    for col, what in (("cell_spec", "cell"), ("client_settings", "client")):
        a, c = (json.loads(x) if isinstance(x, str) and x else {} for x in (b.get(col), n.get(col)))
        out += [f"{what} {k}: {a[k]!r} → {c[k]!r}" for k in sorted(set(a) & set(c)) if a[k] != c[k]]
    return out


def unmeasured(b: pd.Series, n: pd.Series, sides: tuple[str, str] = ("base", "new")) -> str | None:
    """Why a pair of cells has no figure to judge: a status with none on either side, or a search (whose loads
    follow from what it found in each run); None where both have their figures."""
    for side, row in zip(sides, (b, n)):
        if row["status"] not in COMPARABLE_STATUSES:
            return f"{row['status'].replace('_', ' ')} in {side}"
    if workloads.get(b["workload"]).loads_follow_run:
        return "a search or sweep: the loads it measured follow from what it found in each run"
    return None


def _why_not(b: pd.Series, n: pd.Series) -> str | None:
    if b["config_sha256"] != n["config_sha256"]:
        return "the server config differs (flags, environment or models)"
    if b["basis_sha256"] != n["basis_sha256"]:
        changed = differing(b, n)
        if changed:
            return "measured differently (" + "; ".join(changed) + ")"
    return unmeasured(b, n)


def not_judged(ident: dict[str, Any], b: pd.Series, n: pd.Series, why: str, paired: bool) -> dict[str, Any]:
    """The row of a pair of cells with no verdict. ``paired``: the two measured the same thing (the same server
    config, or a pairing the user made): a cell the base had a figure for and the new run has none is lost (to
    the server), one Client-bound on either side a measurement problem (the client's, not the server's)."""
    client = paired and (b["status"] in MEASUREMENT_STATUSES or n["status"] in MEASUREMENT_STATUSES)
    lost = paired and not client and b["status"] in COMPARABLE_STATUSES and n["status"] not in COMPARABLE_STATUSES
    return {**ident, "figure": None, "verdict": NOT_COMPARABLE, "lost": lost, "measurement": client,
            "reason": why + (" (lost)" if lost else " (the client's, not the server's)" if client else "")}


def judge_cell(ident: dict[str, Any], b: pd.Series, n: pd.Series, rb: pd.DataFrame, rn: pd.DataFrame,
               min_effect: float | dict[str, float] | None, noise_multiple: float,
               others: tuple[list[pd.DataFrame], list[pd.DataFrame]] = ([], []),
               level: float = 0.95, min_runs: int = 0) -> list[dict[str, Any]]:
    """Every figure of one pair of cells (their matrix rows ``b``, ``n`` and counted requests ``rb``, ``rn``), a row
    each, by judge_figure: the one definition of each figure's change, shared by regress and compare (the report's
    speed-ups call judge_figure for the figures they show)."""
    as_made = streamed(b) and streamed(n)
    key = f"{ident['server_id']}/{ident['cell_id']}"
    rows = []
    for fig in FIGURES:
        effect = min_effect.get(fig.name) if isinstance(min_effect, dict) else min_effect
        rows.append({**ident, **judge_figure(fig, rb, rn, key, effect, noise_multiple, others, as_made, level,
                                             min_runs)})
    return rows


def ordered(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Verdict rows as a table, changed cells first (``lost`` and ``measurement`` flags filled)."""
    out = pd.DataFrame(rows)
    for flag in ("lost", "measurement"):
        out[flag] = [v is True for v in out[flag]] if flag in out else False
    order = {SLOWER: 0, FASTER: 1, INCONCLUSIVE: 2, SAME: 3, NOT_COMPARABLE: 4}
    out["_o"] = out["verdict"].map(order)
    return out.sort_values(["_o", "server_id", "cell_id"], kind="stable").drop(columns="_o").reset_index(drop=True)


def regress(base_cells: pd.DataFrame, base_reqs: pd.DataFrame, new_cells: pd.DataFrame, new_reqs: pd.DataFrame,
            min_effect: float | dict[str, float] | None = None, noise_multiple: float = 2.0,
            siblings: tuple[list[tuple[pd.DataFrame, pd.DataFrame]], list[tuple[pd.DataFrame, pd.DataFrame]]]
            = ([], []), new_incomplete: bool = False, family_wise: bool = False, min_runs: int = 0) -> pd.DataFrame:
    """One row per cell and figure (cells on one side only: one row, not comparable), changed cells first.
    ``family_wise``: the run-to-run part of each minimum effect at the level that keeps the whole run's chance of
    a false alarm at 5 % (Bonferroni over every figure of every cell both runs measured), not each figure's;
    ``min_runs``: no faster or slower verdict before the store holds that many runs of BASE's side (judge_figure).
    ``siblings``: other runs (cells, requests) of BASE's runtime and of NEW's, for each cell's run-to-run noise.
    ``lost`` marks a cell BASE measured that NEW did not: NEW failed it (or it looped, went over capacity), or,
    where NEW's run is incomplete (``new_incomplete``: jobs failed or did not run), NEW has no such cell."""
    rows = []
    on = ["server_id", "cell_id"]
    both = base_cells.merge(new_cells, on=on, how="outer", suffixes=("_b", "_n"), indicator=True)
    by_b = {k: g for k, g in base_reqs.groupby(on)}
    by_n = {k: g for k, g in new_reqs.groupby(on)}
    level = 0.95
    if family_wise:
        judged = both[(both["_merge"] == "both") & both["status_b"].isin(COMPARABLE_STATUSES)
                      & both["status_n"].isin(COMPARABLE_STATUSES)]
        level = 1 - 0.05 / max(1, len(judged) * len(FIGURES))
    for _, r in both.iterrows():
        ident = {"server_id": r["server_id"], "cell_id": r["cell_id"],
                 "workload": r["workload_b"] if pd.notna(r.get("workload_b")) else r.get("workload_n")}
        if r["_merge"] != "both":
            only_base = r["_merge"] == "left_only"
            lost = only_base and new_incomplete and r.get("status_b") in COMPARABLE_STATUSES
            rows.append({**ident, "figure": None, "verdict": NOT_COMPARABLE, "lost": lost,
                         "reason": f"only in {'base' if only_base else 'new'}"
                                   + (" (lost: the new run did not finish every job)" if lost else "")})
            continue
        b = pd.Series({k[:-2]: v for k, v in r.items() if k.endswith("_b")})
        n = pd.Series({k[:-2]: v for k, v in r.items() if k.endswith("_n")})
        why = _why_not(b, n)
        if why:
            # measured in base, not in new (the same server config and basis): lost to the server, or a
            # measurement problem where it was Client-bound
            rows.append(not_judged(ident, b, n, why, paired=b["config_sha256"] == n["config_sha256"]))
            continue
        key = (r["server_id"], r["cell_id"])
        rb, rn = counted(by_b.get(key, base_reqs.iloc[:0])), counted(by_n.get(key, new_reqs.iloc[:0]))
        others = tuple([o for o in (_same_cell(sc, sr, b, key) for sc, sr in side) if o is not None]
                       for side in siblings)
        rows += judge_cell(ident, b, n, rb, rn, min_effect, noise_multiple, others, level, min_runs)
    return ordered(rows)


def _same_cell(cells: pd.DataFrame, reqs: pd.DataFrame, like: pd.Series, key: tuple) -> pd.DataFrame | None:
    """Another run's requests of the cell, where it measured the same thing with a figure."""
    hit = cells[(cells["server_id"] == key[0]) & (cells["cell_id"] == key[1])]
    if hit.empty or hit.iloc[0]["config_sha256"] != like["config_sha256"] or differing(like, hit.iloc[0]) \
            or hit.iloc[0]["status"] not in COMPARABLE_STATUSES:
        return None
    return counted(reqs[(reqs["server_id"] == key[0]) & (reqs["cell_id"] == key[1])])


def cell_verdicts(table: pd.DataFrame) -> pd.DataFrame:
    """One verdict a cell: slower if any figure is, else faster if any is, else no change, else not comparable."""
    order = [SLOWER, FASTER, INCONCLUSIVE, SAME, NOT_COMPARABLE]
    worst = table.groupby(["server_id", "cell_id"], sort=False)["verdict"].agg(
        lambda v: next(o for o in order if o in set(v)))
    return worst.reset_index()


def nothing_compared(table: pd.DataFrame) -> bool:
    """No cell had a figure in both runs (the new run failed before measuring, or measured other cells): no
    verdict can be given, and a check must not read that as "no cell slower"."""
    return not (table["verdict"] != NOT_COMPARABLE).any()


def lost_cells(table: pd.DataFrame) -> list[str]:
    """The cells (server/cell) the base run measured and the new run lost (``regress``'s ``lost``)."""
    return sorted({f"{r.server_id}/{r.cell_id}" for r in table[table["lost"]].itertuples()}) if "lost" in table \
        else []


def measurement_cells(table: pd.DataFrame) -> list[str]:
    """The cells (server/cell) whose comparison a measurement problem stopped (Client-bound, too few requests)."""
    return sorted({f"{r.server_id}/{r.cell_id}" for r in table[table["measurement"]].itertuples()}) \
        if "measurement" in table else []


def found(table: pd.DataFrame) -> dict[Outcome, list[str]]:
    """Each outcome that is not a pass, with the cells (or the words) that make it."""
    out: dict[Outcome, list[str]] = {}
    lost, measured = lost_cells(table), measurement_cells(table)
    if lost:
        out[Outcome.LOST] = lost
    if nothing_compared(table):
        out[Outcome.NOTHING_COMPARABLE] = ["no cell has a figure in both runs"]
    slower = table[table["verdict"] == SLOWER]
    if len(slower):
        out[Outcome.SLOWER] = sorted({f"{r.server_id}/{r.cell_id}" for r in slower.itertuples()})
    if measured:
        out[Outcome.MEASUREMENT] = measured
    return out


def outcome(table: pd.DataFrame) -> Outcome:
    """The check's outcome (history.gate: the most severe found)."""
    return first(set(found(table)))


def failing(table: pd.DataFrame) -> str | None:
    """Why the verdict is no pass, or None where it passes: every outcome found, the most severe first, each with
    its cells (a release that fails a cell is no pass; a run whose client fell behind is no pass either, but not
    the server's fault)."""
    said = {Outcome.LOST: "the new run lost {n} cell(s) the base measured: {cells}",
            Outcome.NOTHING_COMPARABLE: "nothing to judge: {cells}",
            Outcome.SLOWER: "{n} cell(s) significantly slower beyond their minimum effect: {cells}",
            Outcome.MEASUREMENT: "{n} cell(s) not judged for a measurement problem (Client-bound, or too few "
                                 "requests: not the server's): {cells}"}
    got = found(table)
    parts = [said[o].format(n=len(got[o]), cells=", ".join(got[o])) for o in SEVERITY if o in got]
    return "; ".join(parts) or None


def exit_code(table: pd.DataFrame) -> int:
    """The outcome's exit status (history.gate.Outcome: 0 pass, 1 slower, 3 lost, 4 nothing comparable, 5 a
    measurement problem)."""
    return int(outcome(table))


HOST_PROBE_LIMIT = 0.05  # two runs' host probes further apart than this: the hosts' pace differs


# what makes two runs' machines of one kind: the run-to-run noise of a runtime is read only from its runs on
# machines of the run's kind (an H100's run of a release beside an H200's is a different machine, not noise)
MACHINE_KIND = ("gpu_name", "cpu_model", "cpu_count")


def machine_kind(row: dict[str, Any] | pd.Series) -> tuple:
    """The run's kind of machine (MACHINE_KIND's values; None where it recorded none)."""
    def one(v: Any) -> Any:
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return None
        return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)  # a core count read as 4.0
    return tuple(one(row.get(k)) for k in MACHINE_KIND)


def of_kind(runs: pd.DataFrame, kind: tuple, prefix: str = "") -> pd.Series:
    """Which of ``runs`` (rows with MACHINE_KIND's columns, each named with ``prefix``) ran on a machine of
    ``kind``."""
    return pd.Series([machine_kind({k: r.get(prefix + k) for k in MACHINE_KIND}) == kind
                      for r in runs.to_dict("records")], index=runs.index, dtype=bool)


def machine_change(base: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Where the two runs ran on different kinds of machine (another GPU model, CPU model or core count), what
    changed ("GPU NVIDIA H200 → NVIDIA H100"); None where they are of one kind or either recorded none."""
    kb, kn = machine_kind(base), machine_kind(new)
    names = {"gpu_name": "GPU", "cpu_model": "CPU", "cpu_count": "cores"}
    changed = [f"{names[k]} {a} → {b}" for k, a, b in zip(MACHINE_KIND, kb, kn)
               if a is not None and b is not None and a != b]
    return ", ".join(changed) or None


def withhold(table: pd.DataFrame, change: str) -> pd.DataFrame:
    """The verdicts of runs on different kinds of machine withheld: each judged figure kept with its numbers, its
    verdict not comparable (the machine's difference is not the software's)."""
    out = table.copy()
    judged = out["verdict"] != NOT_COMPARABLE
    out.loc[judged, "verdict"] = NOT_COMPARABLE
    out.loc[judged, "reason"] = f"another kind of machine ({change}): --across-machines judges it anyway"
    out.attrs["machine_change"] = change  # the headline names it
    return out


def hosts(base: dict[str, Any], new: dict[str, Any]) -> str | None:
    """What the two runs' manifests say of where they ran, as a sentence (None when neither recorded the host's ids
    or probe: a store made before them): one host and one boot, or two machines; and, where both probed the host
    before their servers started, how far apart the probes were. A host-bound cell's change is then the host's as
    much as the software's."""
    def get(row: dict[str, Any], key: str) -> Any:
        v = row.get(key)
        return None if v is None or (isinstance(v, float) and np.isnan(v)) else v

    said = []
    if get(base, "boot_id") and get(base, "boot_id") == get(new, "boot_id"):
        said.append("one host, one boot")
    elif get(base, "machine_id") and get(new, "machine_id"):
        said.append("one machine id, two boots (a restart, or two virtual machines made from one image)"
                    if base["machine_id"] == new["machine_id"] else "two machines")
    pb, pn = get(base, "host_probe_ms"), get(new, "host_probe_ms")
    if pb and pn:
        change = pn / pb - 1
        pace = ("the same pace" if abs(change) < HOST_PROBE_LIMIT
                else f"the new host {'slower' if change > 0 else 'faster'} by {abs(change):.0%}")
        said.append(f"host probe {pb:.3g} ms against {pn:.3g} ms ({pace}: one core's Python before each server "
                    f"start; past {HOST_PROBE_LIMIT:.0%} a host-bound cell's change may be the host's)")
    return "; ".join(said) or None
