"""The first screen of a report: the answer to the two questions a run is made for.

Which server config to deploy for a latency target, and whether (and where) speculative decoding pays. From the
matrix, the requests and the decisions: a verdict paragraph, each speculative config's speed-up over its twin per
context x concurrency (the ratio's interval from the cells' requests and repeats, as ``speedmatrix regress``
judges two runs: :func:`speedmatrix.history.regress.judge_figure`), the crossover named per context, and each
config's matrix with the targets each cell meets and the cells that set "best config" marked.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from .. import workloads
from ..core import fmt
from ..core.status import USABLE, Status
from ..core.table import Para, Table
from ..history import regress
from ..judge import decide, lossless

# the regression verdict's default: a change is a verdict only beyond twice the cells' own noise
NOISE_MULTIPLE = 2.0
FIGURES = {f.name: f for f in regress.FIGURES}
FIGURE_LABEL = {"served_tok_s": "tok/s", "tpot_ms": "TPOT"}
WITHIN_NOISE = "within noise"
# the regression verdict's reasons, as a matrix cell says them
SHORT = {"tokens came in bursts: a request's token times are not the server's": "tokens came in bursts"}


def short(reason: str) -> str:
    """A regression verdict's reason as a matrix cell says it."""
    if f"a verdict needs {regress.MIN_REQUESTS}" in reason or f"under the {regress.MIN_REQUESTS} a verdict" in reason:
        return f"under {regress.MIN_REQUESTS} requests"
    return SHORT.get(reason, reason)


@dataclass(frozen=True)
class Plan:
    """What the first screen needs from the experiment: each speculative config's twin (the same model and
    arguments without speculation), each cell's sampling setting as a reader names it, and the targets."""

    twins: dict[str, str] = field(default_factory=dict)
    sampling: dict[tuple[str, str], str] = field(default_factory=dict)
    targets: list = field(default_factory=list)

    @classmethod
    def of(cls, exp: Any) -> Plan:
        twins = {s.id: exp.twin_of(s.id) for s in exp.servers if s.speculative}
        sampling = {(c.server_id, c.id): lossless.label(c.sampling_params) for c in exp.cells()}
        return cls({k: v for k, v in twins.items() if v}, sampling, list(exp.targets))

    def letters(self) -> dict[str, str]:
        """Each target's letter in the matrices (A, B, ...), in the experiment's order."""
        return {t.name: string.ascii_uppercase[i % 26] for i, t in enumerate(self.targets)}


def headline_kind(matrix: pd.DataFrame) -> Any | None:
    """The kind the first screen shows: the seeds' speed-test matrix (sustained decode) where the run has it."""
    return next((workloads.get(n) for n in workloads.names()
                 if workloads.get(n).headline and (matrix["workload"] == n).any()), None)


def _rows(matrix: pd.DataFrame, plan: Plan) -> pd.DataFrame:
    """The headline kind's cells with their sampling setting (the run's most common one first)."""
    kind = headline_kind(matrix)
    if kind is None:
        return matrix.iloc[0:0].assign(sampling=pd.Series(dtype=str))
    m = matrix[matrix["workload"] == kind.name].copy()
    m["sampling"] = [plan.sampling.get((s, c), "") for s, c in zip(m["server_id"], m["cell_id"])]
    common = {s: i for i, s in enumerate(m["sampling"].value_counts(sort=True).index)}
    servers = {s: i for i, s in enumerate(dict.fromkeys(matrix["server_id"]))}
    m = m.assign(_s=m["sampling"].map(common), _c=m["server_id"].map(servers))
    m = m.sort_values(["_s", "_c", "context_tokens", "concurrency"], kind="stable").drop(columns=["_s", "_c"])
    return m


def speedups(matrix: pd.DataFrame, requests: pd.DataFrame | None, plan: Plan,
             figures: str | tuple[str, ...] = "served_tok_s") -> pd.DataFrame:
    """Per speculative config, headline cell both it and its twin measured, and figure (one name or several, the
    requests grouped once for all): the figure with speculation over
    without (``ratio``: each request's output tok/s over its whole time, or TPOT), its 95 % bootstrap interval,
    and the verdict (faster, slower, within noise); a cell either side of which is not usable (Looped, Lossy,
    Over capacity ...) has its ``status_note`` instead and no ratio."""
    cols = ["server_id", "twin", "cell_id", "context_tokens", "concurrency", "sampling", "figure", "ratio",
            "ci_low", "ci_high", "verdict", "reason", "status_note", "unstable"]
    m = _rows(matrix, plan)
    if m.empty or not plan.twins:
        return pd.DataFrame(columns=cols)
    figures = (figures,) if isinstance(figures, str) else tuple(figures)
    by_cell = dict(iter(regress.counted(requests).groupby(["server_id", "cell_id"]))) if requests is not None \
        else {}
    out = []
    order = list(dict.fromkeys(matrix["server_id"]))
    for spec, twin in sorted(plan.twins.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 0):
        twin_cells = m[m["server_id"] == twin].set_index("cell_id")
        for r in m[m["server_id"] == spec].itertuples(index=False):
            if r.cell_id not in twin_cells.index:
                continue
            t = twin_cells.loc[r.cell_id]
            ident = {"server_id": spec, "twin": twin, "cell_id": r.cell_id, "context_tokens": int(r.context_tokens),
                     "concurrency": int(r.concurrency), "sampling": r.sampling, "ratio": None, "ci_low": None,
                     "ci_high": None, "verdict": None, "reason": "", "status_note": None, "unstable": False}
            bad = [(who, s) for who, s in ((spec, r.status), (twin, t["status"])) if s not in USABLE]
            base, new = by_cell.get((twin, r.cell_id)), by_cell.get((spec, r.cell_id))
            as_made = regress.streamed(pd.Series(r._asdict())) and regress.streamed(t)
            for figure in figures:
                row = {**ident, "figure": figure}
                if bad:
                    row["status_note"] = (fmt.status(bad[0][1]) if len(bad) == 2 and bad[0][1] == bad[1][1]
                                          else "; ".join(f"{fmt.status(s)} ({who})" for who, s in bad))
                elif base is None or new is None:
                    row.update(verdict=regress.NOT_COMPARABLE, reason="no requests recorded")
                else:
                    j = regress.judge_figure(FIGURES[figure], base, new, f"{spec}/{twin}/{r.cell_id}", None,
                                             NOISE_MULTIPLE, streamed=as_made)
                    row.update(verdict=j["verdict"], reason=j.get("reason", ""),
                               unstable=Status.UNSTABLE in (r.status, t["status"]))
                    if "change" in j:
                        row.update(ratio=1 + j["change"], ci_low=1 + j["ci_low"], ci_high=1 + j["ci_high"])
                out.append(row)
    return pd.DataFrame(out, columns=cols)


def _ratio_text(r: Any) -> str:
    if r.status_note:
        return r.status_note
    if fmt.missing(r.ratio):
        return f"not comparable ({short(r.reason)})" if r.reason else "not comparable"
    word = WITHIN_NOISE if r.verdict in regress.NO_VERDICT else r.verdict
    text = f"×{r.ratio:.2f} ({r.ci_low:.2f}–{r.ci_high:.2f}) {word}"
    # a side whose repeats disagree: the ratio pools their requests, the matrix shows their median
    return f"{text} ({fmt.status(Status.UNSTABLE)})" if getattr(r, "unstable", False) else text


def _row_label(r: Any, main: str | None) -> str:
    """`config` context, and the sampling setting where it is not the run's most common one."""
    label = f"`{r.server_id}` {fmt.ctx(int(r.context_tokens))}"
    return f"{label} ({r.sampling})" if r.sampling and r.sampling != main else label


def main_sampling(m: pd.DataFrame) -> str | None:
    """The sampling setting most of the headline cells use (rows of another one are labelled with theirs)."""
    return m["sampling"].value_counts().index[0] if len(m) and m["sampling"].any() else None


def speedup_table(s: pd.DataFrame) -> Table | None:
    """Rows: speculative config x context (x sampling setting where not the run's main one) x figure (output tok/s,
    then TPOT where ``s`` has it); columns: concurrency; each cell the ratio with its interval and its verdict, or
    the status that keeps it out."""
    if s.empty:
        return None
    main = main_sampling(s)
    concs = sorted(s["concurrency"].unique())
    figures = list(dict.fromkeys(s["figure"]))
    t = Table(["Config · context · figure", *(str(c) for c in concs)])
    for _, g in s.groupby(["server_id", "sampling", "context_tokens"], sort=False):
        for name in figures:
            by = {r.concurrency: r for r in g[g["figure"] == name].itertuples()}
            t.add(f"{_row_label(g.iloc[0], main)} {FIGURE_LABEL[name]}",
                  *(_ratio_text(by[c]) if c in by else "" for c in concs))
    return t


def _pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.0f} %"


def crossover(g: pd.DataFrame) -> str:
    """One context's sentence: where speculation pays, where it is within noise, where it costs, and between
    which concurrencies it crosses over (cells not counted are said as such)."""
    g = g.sort_values("concurrency")
    judged = g[g["ratio"].notna() & g["verdict"].isin([regress.FASTER, regress.SLOWER, *regress.NO_VERDICT])]
    wins, losses = judged[judged["verdict"] == regress.FASTER], judged[judged["verdict"] == regress.SLOWER]
    same = judged[judged["verdict"].isin(regress.NO_VERDICT)]
    parts = []  # (the lowest concurrency it speaks of, the words): said from the fewest requests at once up
    if len(wins):
        parts.append((wins["concurrency"].min(), f"pays at {_concs(wins)} at once (up to {_pct(wins['ratio'].max())})"))
    if len(same):
        parts.append((same["concurrency"].min(), f"is within noise at {_concs(same)}"))
    if len(losses):
        parts.append((losses["concurrency"].min(), f"costs at {_concs(losses)} (up to {_pct(losses['ratio'].min())})"))
    parts = [words for _, words in sorted(parts, key=lambda p: p[0])]
    if not parts:
        return "no cell both configs measured usably"
    text = ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]
    if len(wins) and len(losses):
        hi_win, lo_loss = int(wins["concurrency"].max()), int(losses["concurrency"].min())
        if hi_win < lo_loss:
            text += f": it crosses over between {hi_win} and {lo_loss} at once"
    left = g[g["status_note"].notna()]
    if len(left):
        text += f"; not counted at {_concs(left)} ({'; '.join(dict.fromkeys(left['status_note']))})"
    return text


def _concs(g: pd.DataFrame) -> str:
    c = [int(x) for x in g["concurrency"]]
    return str(c[0]) if len(c) == 1 else ", ".join(map(str, c[:-1])) + f" and {c[-1]}"


def crossover_lines(s: pd.DataFrame) -> list[str]:
    """One sentence per speculative config, context and sampling setting."""
    if s.empty:
        return []
    main = main_sampling(s)
    out = []
    for (sid, sampling, ctx), g in s.groupby(["server_id", "sampling", "context_tokens"], sort=False):
        where = f"At {fmt.ctx(int(ctx))}" + (f" ({sampling})" if sampling and sampling != main else "")
        out.append(f"{where}, `{sid}` {crossover(g)}.")
    return out


# ---- the configs against the targets ----------------------------------------------------------------------------

def matrices_intro(matrix: pd.DataFrame, plan: Plan) -> str:
    """What a cell of the configs' matrix holds, the targets' limits and the sampling its rows use."""
    main = main_sampling(_rows(matrix, plan))
    letters = plan.letters()
    targets = "; ".join(f"{letters[t.name]} = `{t.name}`, {t.describe()}" for t in plan.targets)
    text = "Each cell: output tok/s over all its requests · median TPOT"
    text += (f" · the targets it meets ({targets}: that percentile of its requests within each limit) · ★ where it "
             "is the best config's cell" if targets else " (the experiment names no latency targets)")
    text += f". Rows decode {main} unless named" if main else ""
    return text + "; rows with no usable cell are under Cells to look at."


def best_cells(decisions: pd.DataFrame | None, kind: str,
               best: pd.DataFrame | None = None) -> dict[tuple[str, str], list[str]]:
    """(server, cell) -> the targets for which it is the best config's cell (of the headline kind)."""
    best = decide.best_configs(decisions) if best is None else best  # (the summary's, computed once)
    best = best[(best["workload"] == kind) & best["best_server"].notna()]
    out: dict[tuple[str, str], list[str]] = {}
    for r in best.itertuples():
        out.setdefault((r.best_server, r.best_cell), []).append(r.slo)
    return out


def target_table(matrix: pd.DataFrame, decisions: pd.DataFrame | None, plan: Plan,
                 best: pd.DataFrame | None = None) -> Table | None:
    """Rows: server config x context (x sampling setting); columns: concurrency; each cell its output tok/s over
    all requests, median TPOT, the letters of the targets it meets and ★ where it sets a best config."""
    m = _rows(matrix, plan)
    if m.empty:
        return None
    kind = m["workload"].iloc[0]
    letters = plan.letters()
    met: dict[tuple[str, str], list[str]] = {}
    if decisions is not None and len(decisions):
        held = decisions[decisions["slo_met"].eq(True)]
        for r in held.itertuples():
            met.setdefault((r.server_id, r.cell_id), []).append(r.slo)
    starred = best_cells(decisions, kind, best)
    main = main_sampling(m)
    concs = sorted(m["concurrency"].unique())
    t = Table(["Config · context", *(str(c) for c in concs)])
    for _, g in m.groupby(["server_id", "sampling", "context_tokens"], sort=False):
        by = {r.concurrency: r for r in g.itertuples()}
        cells = []
        for c in concs:
            r = by.get(c)
            if r is None:
                cells.append("")
                continue
            if r.status not in USABLE:
                cells.append(fmt.status(r.status))
                continue
            text = f"{fmt.num(r.total_tok_s)} · {fmt.time_ms(r.tbt_ms)}"
            meets = [letters.get(n, n) for n in met.get((r.server_id, r.cell_id), [])]
            if plan.targets:
                text += f" · {' '.join(meets)}" if meets else " · none"
            stars = [letters.get(n, n) for n in starred.get((r.server_id, r.cell_id), [])]
            if stars:
                text += " ★" + "".join(stars)
            cells.append(f"{text} ({fmt.status(r.status)})" if r.status == Status.UNSTABLE else text)
        if any(c and c[0].isdigit() for c in cells):  # a row with no usable cell: in Cells to look at
            t.add(_row_label(g.iloc[0], main), *cells)
    return t if len(t) else None


# ---- the verdict ------------------------------------------------------------------------------------------------

def best_sentences(decisions: pd.DataFrame | None, kind: str, plan: Plan,
                   best: pd.DataFrame | None = None) -> list[str]:
    """Per target: the best config at each context of the headline kind, at which concurrency, with its margin
    over the runner-up config."""
    best = decide.best_configs(decisions) if best is None else best
    best = best[best["workload"] == kind]
    out = []
    for name, g in best.groupby("slo", sort=False):
        said = []
        for r in g.itertuples():
            ctx = fmt.ctx(int(r.context_tokens))
            if fmt.missing(r.best_server):
                said.append(f"none meets it at {ctx}")
                continue
            margin = ("the only config meeting it" if fmt.missing(r.margin_pct)
                      else f"{r.margin_pct:+.0f} % over `{r.runner_up_server}`")
            said.append(f"`{r.best_server}` at {ctx} (c{int(r.concurrency)}, {fmt.num(r.goodput_tok_s)} tok/s "
                        f"goodput, {margin})")
        letter = plan.letters().get(name)
        out.append((f"`{name}`" + (f" ({letter})" if letter else ""), "; ".join(said)))
    merged: dict[str, list[str]] = {}
    for who, said in out:
        merged.setdefault(said, []).append(who)
    return [f"for {' and '.join(who)}: {said}" for said, who in merged.items()]


def speculation_sentence(s: pd.DataFrame) -> str | None:
    """Where speculation pays over all its configs: the cells faster, within noise and slower."""
    if s.empty:
        return None
    parts = []
    for sid, g in s.groupby("server_id", sort=False):
        v = g["verdict"]
        n_f, n_s, n_n = int((v == regress.FASTER).sum()), int((v == regress.SLOWER).sum()), \
            int(v.isin(regress.NO_VERDICT).sum())
        left = int(g["status_note"].notna().sum())
        judged = g[g["ratio"].notna()]
        span = (f" (×{judged['ratio'].min():.2f} to ×{judged['ratio'].max():.2f} output tok/s)"
                if len(judged) else "")
        counts = ", ".join(x for x in (f"faster in {n_f}" if n_f else "", f"slower in {n_s}" if n_s else "",
                                       f"within noise in {n_n}" if n_n else "") if x) or "no cell judged"
        parts.append(f"`{sid}` against `{g['twin'].iloc[0]}`: {counts} of {len(g) - left} cells{span}"
                     + (f", {left} not counted" if left else ""))
    return "Speculation: " + "; ".join(parts) + "."


def verdict(matrix: pd.DataFrame, decisions: pd.DataFrame | None, s: pd.DataFrame, plan: Plan,
            look: pd.DataFrame, best: pd.DataFrame | None = None) -> Para:
    """The answer in a paragraph, generated from the figures below it (``best``: decide.best_configs of the
    decisions, where the caller has it)."""
    kind = headline_kind(matrix)
    said = []
    if kind is not None:
        sentences = best_sentences(decisions, kind.name, plan, best)
        if sentences:
            said.append(f"Best config ({kind.title.lower()}) " + "; ".join(sentences) + ".")
        elif not plan.targets:
            said.append("No best config is named: the experiment sets no latency targets (`slos:`).")
    spec = speculation_sentence(s)
    if spec:
        said.append(spec)
    if len(look):
        counts = ", ".join(f"{n} {fmt.status(st)}" for st, n in look["status"].value_counts().items())
        said.append(f"Look at {len(look)} cells before trusting their figures ({counts}): Cells to look at, below.")
    else:
        said.append("Every cell is a plain Valid measurement.")
    return Para(" ".join(said))
