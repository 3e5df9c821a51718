"""The report's tables that are not one workload's own: servers, sweeps, spread, GPU, roofline, agreement, gates,
all measurements. Each returns a :class:`Table` (or ``None`` where it has nothing to show)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from .. import workloads
from ..core import fmt
from ..core.status import NEEDS_A_LOOK, USABLE, Status
from ..core.table import Para, Table, slug
from ..jobs.gates import GATES
from ..judge import lossless
from ..judge.loopcheck import steps_of
from ..measure import stats
from ..peers import OURS, normalized


def by_phase(m: pd.DataFrame, *then: str) -> pd.DataFrame:
    """Rows in the workloads' order (prefill, latency, decode, capacity, prefix cache); then by ``then``."""
    return m.assign(_o=m["workload"].map(workloads.order_of)).sort_values(["_o", *then], kind="stable")


def rows_with(m: pd.DataFrame, column: str) -> pd.DataFrame:
    """The rows where ``column`` has a value (none when the matrix lacks the column: an older run)."""
    return m[m[column].notna()] if column in m else m.iloc[0:0]


def servers_table(matrix: pd.DataFrame, startups: list[dict[str, Any]]) -> Table:
    t = Table(["Server config", "Spec tokens", "Start-up", "KV cache (tokens)", "Max concurrency at max-model-len",
               "vLLM"])
    spec_by_server = matrix.groupby("server_id")["spec_tokens"].first().to_dict()
    for s in startups:
        mc = s.get("max_concurrency")
        t.add(s["server_id"], spec_by_server.get(s["server_id"], "—"), f"{s.get('startup_seconds', 0):.1f} s",
              fmt.integer(s.get("kv_cache_size_tokens")), "—" if mc is None else f"{mc:.2f}x", s.get("vllm_version"))
    return t


BATCHED_NOTE = ("n/m: not measurable. The server delivered this cell's streams in bursts (most events within "
                "1 ms of the one before, after long gaps: `delivery` batched in matrix.parquet), so TTFT and the "
                "time between tokens describe the delivery, not the generation (docs/fidelity.md, section 5).")


BURSTS_NOTE = ("n/m in the time between tokens: at least half of this cell's events came within 1 ms of the one "
               "before (`delivery` bursts, the share in `delivery_burst_share` of matrix.parquet), so its median gap "
               "between events is a gap inside a burst, below what the client resolves, not a time between "
               "tokens. Its TTFT is shown: the first event still marks the first token (docs/fidelity.md, "
               "section 5).")


def batched(r: Any) -> bool:
    return getattr(r, "delivery", None) == "batched"


def tbt_unresolved(r: Any) -> bool:
    """The median gap between the cell's events lies inside a burst (``bursts`` or ``batched``)."""
    return getattr(r, "delivery", None) in ("bursts", "batched")


def with_interval(r: Any, column: str, show) -> str:
    """A median figure and, where the cell was measured several times, its 95 % interval."""
    low, high = getattr(r, f"{column}_ci_low", None), getattr(r, f"{column}_ci_high", None)
    text = show(getattr(r, column))
    return text if fmt.missing(low) or fmt.missing(high) else f"{text} ({fmt.interval(low, high, show)})"


def latency(r: Any, column: str) -> str:
    """TTFT or time between tokens: n/m where the streams came in bursts (for the time between tokens: where
    its median gap lies inside one), else the figure (and interval)."""
    if batched(r) or (column == "tbt_ms" and tbt_unresolved(r)):
        return "n/m"
    return with_interval(r, column, fmt.ms)


# ---- the summary: the answer first ------------------------------------------------------------------------------

# the statuses whose cells a reader should look at before trusting the run (the summary lists them)


def cell_anchor(server_id: str, cell_id: str) -> str:
    """The page anchor of a cell's row in its server config's "All measurements" table."""
    return "cell-" + slug(f"{server_id}-{cell_id}")


def status_counts(m: pd.DataFrame) -> str:
    """"64 cells on 3 server configs: 39 Valid, 12 Client-bound, ..." (most first)."""
    counts = m["status"].value_counts()
    said = ", ".join(f"{n} {fmt.status(s)}" for s, n in counts.items())
    return f"{len(m)} cells on {m['server_id'].nunique()} server configs: {said}."


def spec_versus_plain(m: pd.DataFrame) -> pd.DataFrame:
    """Each usable sustained-decode cell of a speculative config beside the same cell of a config of the same
    model without speculation (the first such): both figures and the change."""
    closed_loop = m["workload"].map(lambda w: workloads.get(w).cut_at_window_end)
    usable = m[closed_loop & m["status"].isin(USABLE)]
    plain = usable[usable["spec_tokens"] == 0].drop_duplicates(["cell_id", "model"])
    spec = usable[usable["spec_tokens"] > 0]
    both = spec.merge(plain[["cell_id", "model", "total_tok_s"]], on=["cell_id", "model"], suffixes=("", "_plain"))
    both["change"] = both["total_tok_s"] / both["total_tok_s_plain"] - 1
    return both


def speculation_pays_table(m: pd.DataFrame) -> Table | None:
    """Per speculative config: does it pay here, by how much over the decode cells both configs measured, with
    its acceptance and whether it keeps the target's output (its losslessness check)."""
    spec_ids = list(dict.fromkeys(m.loc[m["spec_tokens"] > 0, "server_id"])) if "spec_tokens" in m else []
    if not spec_ids:
        return None
    both = spec_versus_plain(m)
    t = Table(["Config", "Method", "k", "Decode cells compared", "Output tok/s vs no speculation (median)",
               "Range", "Acceptance (median)", "Output kept"])
    for sid in spec_ids:
        mine, rows = both[both["server_id"] == sid], m[m["server_id"] == sid]
        first = rows.iloc[0]
        kept = "not checked"
        if "lossless_verdict" in rows and "lossless_setting" in rows:  # (a run aggregated before the check: no)
            verdicts = rows.dropna(subset=["lossless_verdict"]).groupby(["lossless_setting", "lossless_verdict"],
                                                                         sort=False)
            kept = "; ".join(f"{v.capitalize()} ({s})" for (s, v), _ in verdicts) or kept
        if mine.empty:
            t.add(f"`{sid}`", first.get("spec_method") or "—", int(first["spec_tokens"]), 0, "—", "—", "—", kept)
            continue
        change = mine["change"]
        t.add(f"`{sid}`", first.get("spec_method") or "—", int(first["spec_tokens"]), len(mine),
              f"{change.median():+.0%}", f"{change.min():+.0%} to {change.max():+.0%}",
              fmt.pct(mine["spec_acceptance_rate"].median()), kept)
    return t


def needs_a_look_table(m: pd.DataFrame) -> Table | None:
    """The cells whose figures are not plain Valid measurements, each linked to its row, with why."""
    look = by_phase(m[m["status"].isin(NEEDS_A_LOOK)], "server_id", "context_tokens", "concurrency")
    if look.empty:
        return None
    t = Table(["Config", "Cell", "Status", "Why"])
    for r in look.itertuples():
        why = str(r.status_reason) if not fmt.missing(r.status_reason) else ""
        t.add(f"`{r.server_id}`", f"[{r.cell_id}](#{cell_anchor(r.server_id, r.cell_id)})", fmt.status(r.status),
              why if len(why) <= 200 else why[:199] + "…")
    return t


def full_table(m: pd.DataFrame) -> Table:
    """Every cell of one server config, seed 002's full measurements table."""
    t = Table(["Phase", "Context", "Requests at once", "Status", "Total tok/s", "Per request tok/s", "TTFT",
               "Time between tokens", "Average active requests", "Completed requests", "Output tokens",
               "Measured for", "Loop fraction", "Total tok/s without looping requests"])
    for r in by_phase(m, "context_tokens", "concurrency").itertuples():
        kind = workloads.get(r.workload)
        measured = r.status != Status.OVER_CAPACITY

        def shown(text: str, measured: bool = measured) -> str:
            return text if measured else "—"

        t.add(kind.phase(r), fmt.ctx(int(r.context_tokens)), int(r.concurrency), status_text(r),
              shown(with_interval(r, kind.headline_tok_s, fmt.num)), shown(fmt.num(r.per_request_tok_s)),
              shown(latency(r, "ttft_ms")), shown(latency(r, "tbt_ms")), shown(fmt.num(r.avg_active_requests)),
              shown(fmt.integer(r.completed_requests)), shown(fmt.integer(r.output_tokens)),
              shown(fmt.seconds(r.measured_s)),
              "—" if fmt.missing(r.loop_fraction) else f"{float(r.loop_fraction):.0%}",
              fmt.num(r.total_tok_s_non_looping) if measured and kind.headline_tok_s == "total_tok_s" else "—",
              anchor=cell_anchor(r.server_id, r.cell_id))
    return t


_VARY_HEADERS = {"speculative.num_speculative_tokens": "Spec tokens", "args.max-num-seqs": "max-num-seqs",
                 "args.max-num-batched-tokens": "batch", "env.VLLM_USE_V2_MODEL_RUNNER": "Runner", "model": "Model"}


def _vary_header(path: str) -> str:
    return _VARY_HEADERS.get(path, path.split(".")[-1])


def _label(cell: Any) -> str:
    return workloads.get(cell.workload).cell_label(cell)


class _Sweep:
    """A sweep's points (server configs) against the first point's cells, for ``sweep_tables``."""

    def __init__(self, m: pd.DataFrame, rows: list[Any]) -> None:
        self.rows = rows
        self.paths = list(rows[0].sweep_values)
        self.heads = [_vary_header(pth) for pth in self.paths]
        self.valid = m[m["status"] != Status.OVER_CAPACITY]
        first = m[m["server_id"] == rows[0].id].sort_values(["workload", "context_tokens", "concurrency"])
        self.cells = list(first.itertuples())
        self.spec = any(s.spec_tokens for s in rows)

    def point(self, s: Any) -> list[str]:
        return [str(s.sweep_values[pth]["label"]) for pth in self.paths]

    def pick(self, sid: str, c: Any) -> Any:
        r = self.valid[(self.valid["server_id"] == sid) & (self.valid["cell_id"] == c.cell_id)]
        return None if r.empty else r.iloc[0]

    @staticmethod
    def status_or(r: Any, text: str) -> str:
        if r is None:
            return "Over capacity"
        return text if r["status"] == Status.VALID else fmt.status(r["status"])

    @staticmethod
    def value(r: Any, key: str, how=fmt.ms) -> str:
        return "—" if r is None else how(r[key])

    def one_cell(self) -> list[Table | Para]:
        """tok/s, mean and median TTFT (and acceptance) of the one cell, per point (seed 000)."""
        c, rows = self.cells[0], self.rows
        cols = ["tok/s", "Mean TTFT", "Median TTFT"] + (["Acceptance rate", "Accept length"] if self.spec else [])
        t = Table(self.heads + cols + [f"tok/s vs {'/'.join(self.point(rows[0]))}"])
        base = self.pick(rows[0].id, c)
        for s in rows:
            r = self.pick(s.id, c)
            tok = None if r is None else r["total_tok_s"]
            vals = [self.status_or(r, fmt.num(tok)), self.value(r, "mean_ttft_ms"), self.value(r, "ttft_ms")]
            if self.spec:
                vals += [self.value(r, "spec_acceptance_rate", fmt.pct),
                         self.value(r, "spec_acceptance_length", lambda v: fmt.whole(v, "{:.2f}"))]
            vals.append(fmt.delta(None if base is None else base["total_tok_s"], tok))
            t.add(*self.point(s), *vals)
        return [t]

    def one_at_a_time(self) -> list[Table | Para]:
        """TTFT per input size, mean tok/s (and acceptance), per point (seed 000's batched-tokens table)."""
        cols = [f"{_label(c)} TTFT" for c in self.cells] + ["tok/s"] + (["Acceptance rate"] if self.spec else [])
        t = Table(self.heads + cols)
        for s in self.rows:
            rs = [self.pick(s.id, c) for c in self.cells]
            vals = [self.status_or(r, fmt.ms(r["ttft_ms"]) if r is not None else "") for r in rs]
            tok = [r["per_request_tok_s"] for r in rs if r is not None and not fmt.missing(r["per_request_tok_s"])]
            vals.append(fmt.num(sum(tok) / len(tok)) if tok else "—")
            if self.spec:
                acc = [r["spec_acceptance_rate"] for r in rs
                       if r is not None and not fmt.missing(r["spec_acceptance_rate"])]
                vals.append(fmt.pct(sum(acc) / len(acc)) if acc else "—")
            t.add(*self.point(s), *vals)
        return [t]

    def capacity(self) -> list[Table | Para]:
        """Throughput per cell, the largest cell's p95 TTFT, then the changes against the first row (seed 003)."""
        rows, cells = self.rows, self.cells
        last = max(cells, key=lambda c: (c.concurrency, c.context_tokens))
        cols = [_label(c) for c in cells] + [f"{_label(last)} p95 TTFT"]
        t = Table(self.heads + cols)
        picked = {}
        for s in rows:
            rs = [self.pick(s.id, c) for c in cells]
            picked[s.id] = rs
            vals = [self.status_or(r, fmt.num(r["total_tok_s"]) if r is not None else "") for r in rs]
            t.add(*self.point(s), *vals, self.value(self.pick(s.id, last), "p95_ttft_ms"))
        changes = Table(self.heads + cols)
        for s in rows:
            vals = [fmt.delta(None if a is None else a["total_tok_s"], None if b is None else b["total_tok_s"])
                    for a, b in zip(picked[rows[0].id], picked[s.id], strict=True)]
            a, b = self.pick(rows[0].id, last), self.pick(s.id, last)
            vals.append(fmt.delta(None if a is None else a["p95_ttft_ms"], None if b is None else b["p95_ttft_ms"]))
            changes.add(*self.point(s), *vals)
        ref = "/".join(self.point(rows[0]))
        return [t, Para(f"Change against {ref} (output tok/s; p95 TTFT: lower is better):"), changes]


def sweep_tables(m: pd.DataFrame, servers: list[Any]) -> list[Table | Para]:
    """One row per point of a sweep (seed 000's sweep tables; seed 003's matched comparison).

    One cell per config: tok/s, mean TTFT and (with speculation) acceptance, as seed 000's
    speculative and max-num-seqs tables. Only one-at-a-time cells: TTFT per input size and tok/s
    (seed 000's batched-tokens table). Otherwise: output tok/s per cell and the p95 TTFT of the
    largest, then each column's change against the first row (seed 003).
    """
    rows = [s for s in servers if (m["server_id"] == s.id).any()]
    if not rows:
        return [Para("(no measurements)")]
    sweep = _Sweep(m, rows)
    if len(sweep.cells) == 1:
        return sweep.one_cell()
    if all(workloads.get(c.workload).one_at_a_time for c in sweep.cells):
        return sweep.one_at_a_time()
    return sweep.capacity()


def speculative_table(m: pd.DataFrame) -> Table | None:
    """Per decode cell of a config with speculation: the server's acceptance (rate, length, per position),
    the client's (whole output and before loops) and output tok/s against the same cell without speculation
    (a config of the same model with no drafter; the first such config)."""
    closed_loop = m["workload"].map(lambda w: workloads.get(w).cut_at_window_end)  # sustained decode
    dec = m[closed_loop & (m["status"] != Status.OVER_CAPACITY)]
    spec = dec[dec["spec_tokens"] > 0]
    if spec.empty:
        return None
    plain = dec[dec["spec_tokens"] == 0]
    t = Table(["Config", "Method", "Cell", "k", "Acceptance", "Length", "Per position", "Client: all",
               "Client: before loop", "tok/s", "vs no speculation"])
    for r in spec.sort_values(["server_id", "context_tokens", "concurrency"]).itertuples():
        base = plain[(plain["cell_id"] == r.cell_id) & (plain["model"] == r.model)]
        base_tok = base.iloc[0]["total_tok_s"] if not base.empty else None
        per = r.spec_decode_per_position_acceptance
        per_text = "—" if fmt.missing_list(per) else " / ".join(f"{float(v):.2f}" for v in per)
        # a run aggregated before these columns existed has none of them
        method, client_all, client_before = (getattr(r, c, None) for c in (
            "spec_method", "spec_acceptance_client", "spec_acceptance_before_loop"))
        t.add(f"`{r.server_id}`", method or "—", f"`{r.cell_id}`", str(int(r.spec_tokens)),
              fmt.pct(r.spec_acceptance_rate),
              fmt.whole(r.spec_acceptance_length, "{:.2f}"), per_text, fmt.pct(client_all), fmt.pct(client_before),
              fmt.num(r.total_tok_s) + ("" if r.status == Status.VALID else f" ({fmt.status(r.status)})"),
              fmt.delta(base_tok, r.total_tok_s))
    return t


def _listed(values: Any, show) -> str:
    return "—" if values is None or fmt.missing_list(values) else ", ".join(show(v) for v in values)


def spread_table(m: pd.DataFrame) -> Table | None:
    """Cells measured several times (``repeats``): each repeat's figure, the median, its interval and CV."""
    if "repeats" not in m:
        return None
    m = m.assign(n_measured=measured_repeats(m))
    d = m[(m["n_measured"] > 1) & (m["status"] != Status.OVER_CAPACITY)]
    if d.empty:
        return None
    t = Table(["Server config", "Cell", "Repeats", "Total tok/s (each repeat)", "Median", "95 % interval", "CV",
               "Median TTFT (each repeat)", "Status"])
    for r in by_phase(d, "server_id", "context_tokens", "concurrency").itertuples():
        t.add(r.server_id, r.cell_id, int(r.n_measured), _listed(r.total_tok_s_repeats, fmt.num),
              fmt.num(r.total_tok_s),
              fmt.interval(r.total_tok_s_ci_low, r.total_tok_s_ci_high), fmt.pct(r.total_tok_s_cv),
              _listed(r.ttft_ms_repeats, fmt.ms), status_text(r))
    return t


def measured_repeats(m: pd.DataFrame) -> pd.Series:
    """The repeats each cell measured: a stopping rule's cell may stop before its ``repeats``."""
    most = pd.to_numeric(m["repeats"]).fillna(1)
    return pd.to_numeric(m["repeats_measured"]).fillna(most) if "repeats_measured" in m else most


def precision_rows(m: pd.DataFrame) -> pd.DataFrame:
    """The measured cells with a stopping rule's outcome (sustained decode), each with the seconds it measured
    (``measured_s``: its windows summed) against the most it could have (``duration_s`` x ``repeats``)."""
    if "precision_stop" not in m:
        return m.iloc[0:0]
    d = m[m["precision_stop"].notna() & (m["status"] != Status.OVER_CAPACITY)]
    return d.assign(n_measured=measured_repeats(d), s_measured=pd.to_numeric(d["measured_s"]),
                    s_most=pd.to_numeric(d["duration_s"]) * pd.to_numeric(d["repeats"]).fillna(1))


def precision_summary(m: pd.DataFrame) -> str | None:
    """One sentence: how the cells stopped and the measurement time the rule took against fixed windows."""
    d = precision_rows(m)
    if d.empty:
        return None
    counts = d["precision_stop"].value_counts()
    stops = ", ".join(f"{n} {stop.replace('_', ' ')}" for stop, n in counts.items())
    took, most = d["s_measured"].sum(), d["s_most"].sum()
    return (f"{len(d)} sustained-decode cells: {stops}. They measured {took:.1f} s of windows, {took / most:.0%} of "
            f"the {most:.1f} s their longest windows and most repeats would have taken.")


def precision_table(m: pd.DataFrame) -> Table | None:
    """Each sustained-decode cell's stopping rule: why it stopped, what it measured, the precision it reached."""
    d = precision_rows(m)
    if d.empty:
        return None
    t = Table(["Server config", "Cell", "Stopped", "Windows (s)", "Repeats", "Output tok/s interval", "Target",
               "Status"])
    for r in by_phase(d, "server_id", "context_tokens", "concurrency").itertuples():
        reached = "—" if fmt.missing(r.precision_reached) else f"±{float(r.precision_reached):.1%}"
        target = "off" if fmt.missing(r.precision_target) else f"±{float(r.precision_target):.1%}"
        t.add(r.server_id, r.cell_id, str(r.precision_stop).replace("_", " "), fmt.whole(r.measured_s, "{:.2f}"),
              f"{int(r.n_measured)} of {int(r.repeats)}", reached, target, status_text(r))
    return t


def beside_table(m: pd.DataFrame) -> Table | None:
    """Cells that measured while cells of other server configs measured on other GPUs of the node."""
    if "ran_beside" not in m:
        return None
    d = m[m["ran_beside"].notna()]
    if d.empty:
        return None
    t = Table(["Server config", "GPUs", "Cell", "Measured beside", "Total tok/s", "Median TTFT"])
    for r in d.sort_values(["server_id", "cell_id"]).itertuples():
        t.add(r.server_id, r.server_gpus or "—", r.cell_id, r.ran_beside, fmt.num(r.total_tok_s), fmt.ms(r.ttft_ms))
    return t


def status_text(r: Any) -> str:
    """The status as the report shows it, with its reason where it has one (Unstable: the CV)."""
    reason = getattr(r, "status_reason", None)
    return fmt.status(r.status) + (f" ({reason})" if isinstance(reason, str) and reason else "")


def gpu_table(m: pd.DataFrame) -> Table | None:
    """NVML telemetry over each cell's measurement window."""
    d = rows_with(m, "gpu_name")
    if d.empty:
        return None
    t = Table(["Phase", "Context", "Requests at once", "Power (W)", "Energy / output token (J)", "SM util",
               "Mem util", "SM clock (MHz)", "Mem clock (MHz)", "PCIe rx / tx (MB/s)", "Max temp (°C)"])
    f = fmt.whole
    for r in by_phase(d, "context_tokens", "concurrency").itertuples():
        t.add(r.workload, fmt.ctx(int(r.context_tokens)), int(r.concurrency), f(r.gpu_power_w),
              f(r.gpu_energy_per_output_token_j, "{:.3f}"), f"{f(r.gpu_sm_util_pct)} %", f"{f(r.gpu_mem_util_pct)} %",
              f(r.gpu_sm_clock_mhz), f(r.gpu_mem_clock_mhz), f"{f(r.gpu_pcie_rx_mb_s)} / {f(r.gpu_pcie_tx_mb_s)}",
              f(r.gpu_temp_c_max))
    return t


def per_gpu_table(m: pd.DataFrame) -> Table | None:
    """Several GPUs (tensor parallel): each GPU's power, SM utilisation and PCIe traffic per cell, like seed
    000's per-phase table."""
    d = rows_with(m, "gpu_count")
    d = d[d["gpu_count"] > 1]
    if d.empty:
        return None
    n = int(d["gpu_count"].max())
    heads = ["Phase", "Context", "Requests at once"]
    for g in range(n):
        heads += [f"GPU{g} power (W)", f"GPU{g} SM util", f"GPU{g} PCIe rx / tx (MB/s)"]
    t = Table(heads)
    f = fmt.whole
    for r in by_phase(d, "context_tokens", "concurrency").itertuples():
        per = json.loads(r.gpu_per_gpu) if isinstance(r.gpu_per_gpu, str) else []
        vals = [r.workload, fmt.ctx(int(r.context_tokens)), str(int(r.concurrency))]
        for g in range(n):
            x = per[g] if g < len(per) else {}
            vals += [f(x.get("power_w_mean")), f"{f(x.get('sm_util_pct_mean'))} %",
                     f"{f(x.get('pcie_rx_mb_s_mean'))} / {f(x.get('pcie_tx_mb_s_mean'))}"]
        t.add(*vals)
    return t


def roofline_table(m: pd.DataFrame) -> Table | None:
    """Decode at concurrency 1: the memory-bandwidth bound per token against the measured time."""
    d = rows_with(m, "roofline_pct")
    if d.empty:
        return None
    t = Table(["Context", "Repeats", "Measured time between tokens", "Bound (weights / peak bandwidth)",
               "Weights on a GPU", "Peak bandwidth", "Of the roofline"])
    for r in d.sort_values(["context_tokens"]).itertuples():
        t.add(fmt.ctx(int(r.context_tokens)), fmt.integer(r.repeats), latency(r, "tbt_ms"),
              f"{float(r.roofline_bound_ms):.2f} ms", f"{float(r.model_weights_gib):.1f} GiB",
              f"{float(r.roofline_peak_bw_tb_s):g} TB/s",
              f"{float(r.roofline_pct):.1f} %")
    return t


def reference_table(refs: list[dict[str, Any]]) -> Table:
    """One row per cell and client: each client's medians over its rounds with their range, and its
    difference from speedmatrix's medians (client against ours)."""
    t = Table(["Server config", "Cell", "Client", "Rounds", "Output tok/s (range)", "Δ", "Median TTFT (range)", "Δ",
               "Median TPOT, per request (range)", "Δ", "Median ITL, between events", "Client CPU / process wall"])

    def pct(v: Any) -> str:
        return "—" if v is None else f"{v:+.1f} %"

    def rng(v: Any, f) -> str:
        return "" if not v else f" ({f(v[0])}-{f(v[1])})"

    for d in map(normalized, refs):
        for who in d["clients"]:
            med, spread, diff = d["medians"][who], d["spread"][who], d["difference_pct"].get(who, {})
            cpu, wall = med.get("client_cpu_s"), med.get("process_wall_s")
            ok = sum(1 for r in d["runs"][who] if not r.get("error"))
            lost = len(d["runs"][who]) - ok
            t.add(d["server_id"], d["cell"]["cell_id"], who, f"{ok}" + (f" (+{lost} failed)" if lost else ""),
                  fmt.num(med["output_throughput"]) + rng(spread["output_throughput"], fmt.num),
                  "" if who == OURS else pct(diff.get("output_throughput")),
                  fmt.ms(med["median_ttft_ms"]) + rng(spread["median_ttft_ms"], fmt.ms),
                  "" if who == OURS else pct(diff.get("median_ttft_ms")),
                  fmt.ms(med.get("median_tpot_ms")) + rng(spread.get("median_tpot_ms"), fmt.ms),
                  "" if who == OURS else pct(diff.get("median_tpot_ms")),
                  fmt.ms(med.get("median_itl_ms")),
                  "—" if cpu is None else f"{cpu:.1f} s / {wall:.1f} s")
    return t


def reference_notes(refs: list[dict[str, Any]]) -> list[str]:
    """What each client's figures mean where they differ from ours (once per client)."""
    notes: dict[str, str] = {}
    failed: dict[str, str] = {}
    for d in map(normalized, refs):
        notes.update(d.get("notes") or {})
        failed.update(d.get("failed") or {})
    return ([f"{who}: {text}" for who, text in notes.items()]
            + [f"{who} failed: {_error_line(error)}" for who, error in failed.items()])


def _error_line(error: str) -> str:
    """The line of a client's output that says what went wrong: its last that names an error, else its last
    (a client's output ends in a log path or a box, not in the reason)."""
    lines = [line.strip(" │") for line in error.strip().splitlines() if line.strip(" │")]
    for says in (lambda t: " ERROR " in f" {t} ", lambda t: "Error:" in t or "failed" in t):
        named = [line for line in lines if says(line)]
        if named:
            return named[-1][:300]
    return (lines or [""])[-1][:300]




def category_table(matrix: pd.DataFrame, requests: pd.DataFrame | None) -> Table | None:
    """Cells whose prompts came from a dataset with categories: per category, the requests, their median TTFT and
    output rate, and the speculative acceptance the client read from their streamed events (accepted / (steps x
    k)); the server's counters are per cell, so per category only the client can say."""
    if requests is None or "category" not in requests or requests["category"].isna().all():
        return None
    spec = matrix.drop_duplicates("server_id").set_index("server_id")["spec_tokens"].fillna(0).astype(int)
    t = Table(["Config", "Cell", "Category", "Requests", "TTFT p50", "Output tok/s a request (p50)",
               "Acceptance (client)"])
    rows = requests[requests["category"].notna() & requests["error"].isna()]
    for (sid, cid, cat), g in rows.groupby(["server_id", "cell_id", "category"], sort=True):
        k = int(spec.get(sid, 0))
        steps = accepted = 0
        for chunks in g["chunk_tokens"]:
            s, a = steps_of(chunks)
            steps, accepted = steps + s, accepted + a
        t.add(f"`{sid}`", f"`{cid}`", cat, len(g), fmt.ms(g["ttft_ms"].median()),
              fmt.num(np.nanmedian(stats.request_tok_s(g["start_s"], g["end_s"], g["ttft_ms"], g["output_tokens"]))),
              f"{accepted / (steps * k):.1%}" if k and steps else "—")
    return t


def lossless_table(checks: list[dict[str, Any]], m: pd.DataFrame) -> Table | None:
    """Each speculative config's losslessness check per sampling setting: the verdict, its figures and the
    cells it decided (speedmatrix.judge.lossless)."""
    if not checks:
        return None
    t = Table(["Config", "Twin", "Setting", "Verdict", "Greedy: identical", "Below floor: config / twin",
               "Mean target log-prob: config / twin", "Acceptance", "Cells"])
    setting = m["lossless_setting"] if "lossless_setting" in m else pd.Series(index=m.index, dtype=object)
    for doc in sorted(checks, key=lambda d: d["server_id"]):
        for v in doc["settings"]:
            decided = int(((m["server_id"] == doc["server_id"]) & (setting == v["label"])).sum())
            ties = f" ({v['near_ties']} near ties)" if v.get("near_ties") else ""
            ident = f"{v['identical']} of {v['requests']}{ties}" if v["greedy"] else "—"
            t.add(f"`{doc['server_id']}`", f"`{doc['twin']}`", v["label"], (v["verdict"] or "—").capitalize(), ident,
                  f"{fmt.pct(v.get('share_below_floor'))} / {fmt.pct(v.get('twin_share_below_floor'))}",
                  f"{fmt.whole(v.get('mean_logprob'), '{:.2f}')} / {fmt.whole(v.get('twin_mean_logprob'), '{:.2f}')}",
                  fmt.pct(v.get("acceptance")), str(decided))
    return t


def lossless_notes(checks: list[dict[str, Any]], m: pd.DataFrame, device: str, enabled: bool = True) -> list[str]:
    """What the verdicts mean here: each Lossy setting's reason, the configs left unchecked, and on the CPU
    what a Lossy sampled verdict says about benchmarking speculation there."""
    notes = [f"`{d['server_id']}`, {v['label']}: {v['reason']}." for d in checks for v in d["settings"]
             if v["verdict"] == lossless.LOSSY]
    checked = {d["server_id"] for d in checks}
    spec = sorted(set(m.loc[m["spec_tokens"] > 0, "server_id"]) - checked) if "spec_tokens" in m else []
    if spec:
        why = ("no config of the experiment has the same model and arguments without speculation to compare with; "
               "add one to check them" if enabled else "the experiment turns the check off: `lossless.enabled`")
        notes.append(f"Not checked: {', '.join(f'`{s}`' for s in spec)} ({why}).")
    lossy_sampled = any(v["verdict"] == lossless.LOSSY and not v["greedy"] for d in checks for v in d["settings"])
    if lossy_sampled and device == "cpu":
        notes.append("On vLLM for the CPU, sampled requests through a speculative config did not keep the target's "
                     "distribution here, as in most recorded runs (greedy ones do): benchmark speculation there "
                     "greedy; a sampled speculative figure measures another model's output (docs/fidelity.md).")
    return notes


def gate_verdict_text(gate: str, d: dict[str, Any]) -> str:
    """PASS, or FAIL with its reason; a gate the experiment expects to fail says so (and why), and a pass it
    did not expect is called unexpected."""
    text = "PASS" if d["passed"] else f"FAIL: {str(d.get('reason'))[:80]}"
    if gate == "tool_calls" and "valid" in d and d["passed"]:
        text += f" ({d['valid']}/{d['count']})"
    if d.get("expect") == "fail":
        because = (d.get("settings") or {}).get("because")
        text = (f"FAIL, as expected{': ' + because if because else ''} ({text[6:]})" if not d["passed"]
                else f"{text} (unexpected: expected to fail)")
    return text


def gates_table(gates: list[dict[str, Any]]) -> Table:
    """Seed 003's quality gates: one row per server config, PASS or FAIL with the reason."""
    names = [g for g in GATES if any(d["gate"] == g for d in gates)]
    t = Table(["Server config", *(GATES[g].label for g in names)])
    for sid in sorted({d["server_id"] for d in gates}):
        vals = []
        for g in names:
            d = next((d for d in gates if d["server_id"] == sid and d["gate"] == g), None)
            if d is None:
                vals.append("—")
                continue
            vals.append(gate_verdict_text(g, d).replace("|", "/"))
        t.add(sid, *vals)
    return t


def loop_policy_text(m: pd.DataFrame, settings: dict[str, Any]) -> str:
    policy = settings.get("policy", "any")
    rule = {"any": "one looping request marks a cell Looped (seed 002's rule)",
            "fraction": f"a cell is Looped when more than {float(settings.get('max_loop_fraction', 0.1)):.0%} of "
                        "its requests loop",
            "flag_only": "looping is reported and never changes a cell's status"}.get(policy, policy)
    sent = m[m.status != Status.OVER_CAPACITY]
    looped = int(sent.looped_requests.fillna(0).sum()) if "looped_requests" in sent else 0
    total = int(sent.num_requests.fillna(0).sum())
    unreliable = int((sent.spec_acceptance_reliable == False).sum())  # noqa: E712
    text = (f"Loop policy `{policy}`: {rule}. {looped} of {total} measured requests looped "
            f"({looped / total:.1%}) across {int((sent.loop_fraction.fillna(0) > 0).sum())} cells."
            if total else f"Loop policy `{policy}`: {rule}.")
    if unreliable:
        text += (f" In {unreliable} cells with speculative decoding some output loops: their acceptance rate is "
                 "marked unreliable (`spec_acceptance_reliable` false in matrix.parquet).")
    return text


def runtime_lines(lock: dict[str, Any], models_lock: dict[str, Any] | None) -> list[str]:
    """The provenance of a run: its runtime (packages or image digest) and every model's pin."""
    if lock.get("image_ref"):
        out = [f"runtime: {lock.get('runtime')} image `{lock.get('image')}` pinned to `{lock.get('image_ref')}` "
               f"(resolved {lock.get('pinned_at')})"]
    elif lock.get("command"):
        out = [f"runtime: `{' '.join(lock['command'])}` ({lock.get('vllm_version')})"]
    else:
        out = [
            f"vLLM: {lock.get('vllm_distribution')} {lock.get('vllm_version')} · torch {lock.get('torch_version')}"
            f" · Python {lock.get('python_version')} · {lock.get('platform')}",
            f"runtime: `{lock.get('runtime_ref')}` (package set sha256 `{str(lock.get('packages_sha256'))[:16]}…`)",
        ]
    for name, m in ((models_lock or {}).get("models") or {}).items():
        if m.get("source") == "huggingface":
            pin = "" if m.get("pinned") else f" (from `{m.get('revision_requested')}`)"
            out.append(f"model `{name}`: {m['repo']} at commit `{m['revision']}`{pin}, {len(m['files'])} files")
        elif m.get("source") == "trained":
            out.append(f"model `{name}`: {m.get('weights', 'trained')}, {len(m.get('files') or {})} files")
        else:
            out.append(f"model `{name}`: synthesized `{m.get('preset')}` ({m.get('weights', 'random weights')})")
    return out


def run_lines(matrix: pd.DataFrame, startups: list[dict[str, Any]]) -> list[str]:
    """Where and when: the hosts, their GPUs, the measurement's first and last cell, vLLM as served."""
    out = []
    hosts = sorted({str(h) for h in matrix.get("hostname", pd.Series(dtype=str)).dropna()})
    gpus = sorted({str(g) for g in matrix.get("gpu_name", pd.Series(dtype=str)).dropna()})
    if hosts:
        out.append(f"hardware: {', '.join(hosts)}"
                   + (f" · GPU {', '.join(gpus)}" if gpus else " · CPU (no GPU telemetry)"))
    started = sorted(str(t) for t in matrix.get("started_at", pd.Series(dtype=str)).dropna())
    if started:
        out.append(f"measured: {started[0]} to {started[-1]} ({len(matrix)} cells)")
    served = sorted({str(s.get("vllm_version")) for s in startups if s.get("vllm_version")})
    if served:
        out.append(f"vLLM as served (/version): {', '.join(served)}")
    return out


# ---- decisions (speedmatrix.measure.slo, speedmatrix.judge.decide) ---------------------------------------------------

def targets_table(targets: list) -> Table | None:
    if not targets:
        return None
    t = Table(["Target", "Percentile", "TTFT", "TPOT", "End to end", "From"])
    for x in targets:
        t.add(f"`{x.name}`", f"p{x.percentile:g}", fmt.ms(x.ttft_ms), fmt.ms(x.tpot_ms), fmt.ms(x.e2e_ms),
              x.preset or "the experiment")
    return t


def _holds(v: Any) -> str:
    return "—" if fmt.missing(v) else ("holds" if bool(v) else "misses")


def goodput_table(decisions: pd.DataFrame) -> Table | None:
    """Each cell judged against each target: whether it holds at the target's percentile, the share of requests
    that met it, and the goodput (output tok/s of those requests)."""
    if decisions is None or decisions.empty:
        return None
    d = decisions[decisions["workload"].map(lambda k: workloads.get(k).throughput or workloads.get(k).searches)]
    if d.empty:
        return None
    names = list(dict.fromkeys(d["slo"]))
    t = Table(["Server config", "Cell", *(f"`{n}`" for n in names)])
    d = by_phase(d, "server_id", "context_tokens", "concurrency")
    for (sid, _cid), g in d.groupby(["server_id", "cell_id"], sort=False):
        by = {r.slo: r for r in g.itertuples()}
        cells = []
        for n in names:
            r = by.get(n)
            cells.append("—" if r is None else
                         f"{_holds(r.slo_met)}: {fmt.pct(r.attainment)} met, {fmt.num(r.goodput_tok_s)} tok/s")
        first = g.iloc[0]
        kind = workloads.get(first["workload"])
        if kind.searches:  # its row's concurrency is the load the search found
            found = "none" if fmt.missing(first["concurrency"]) or not first["concurrency"] else \
                f"c{int(first['concurrency'])}"
            label = f"{kind.title} {fmt.ctx(int(first['context_tokens']))}: {found}"
        else:
            label = f"{kind.title} {kind.cell_label(first)}"
        t.add(sid, label, *cells)
    return t


def best_config_table(best: pd.DataFrame) -> Table | None:
    if best is None or best.empty:
        return None
    t = Table(["Target", "Kind", "Context", "Best config", "At", "Goodput tok/s", "Runner-up", "Its goodput",
               "Margin", "Configs meeting"])
    for r in best.itertuples():
        kind = workloads.get(r.workload)
        if fmt.missing(r.best_server):
            t.add(f"`{r.slo}`", kind.title, fmt.ctx(int(r.context_tokens)), "none meets it", "—", "—", "—", "—",
                  "—", f"0 of {r.configs_tried}")
            continue
        t.add(f"`{r.slo}`", kind.title, fmt.ctx(int(r.context_tokens)), r.best_server, f"c{int(r.concurrency)}",
              with_interval(r, "goodput_tok_s", fmt.num),
              "—" if fmt.missing(r.runner_up_server) else f"{r.runner_up_server} at c{int(r.runner_up_concurrency)}",
              fmt.num(r.runner_up_goodput_tok_s), "—" if fmt.missing(r.margin_pct) else f"{r.margin_pct:+.1f}%",
              f"{r.configs_meeting} of {r.configs_tried}")
    return t


def sweep_best_table(best: pd.DataFrame) -> Table | None:
    if best is None or best.empty:
        return None
    t = Table(["Sweep", "Kind", "Context", "Concurrency", "Best point", "tok/s", "Runner-up", "Its tok/s", "Margin",
               "Intervals overlap"])
    for r in best.itertuples():
        t.add(r.sweep, workloads.get(r.workload).title, fmt.ctx(int(r.context_tokens)), int(r.concurrency),
              r.best_point, with_interval(r, "tok_s", fmt.num), r.runner_up_point, fmt.num(r.runner_up_tok_s),
              "—" if fmt.missing(r.margin_pct) else f"{r.margin_pct:+.1f}%",
              "yes: not separable" if r.overlapping else "no")
    return t


def pareto_table(points: pd.DataFrame, per: str = "GPU") -> Table | None:
    """The frontier's points, from the most tok/s per user to the most tok/s per GPU."""
    if points is None or points.empty or not points["on_frontier"].any():
        return None
    cols = ["Run", "Server config", "Cell"] if points["run"].nunique() > 1 else ["Server config", "Cell"]
    t = Table([*cols, "Status", "tok/s per user", f"tok/s per {per}", "TTFT p50"])
    for r in points[points["on_frontier"]].sort_values("tok_s_per_user", ascending=False).itertuples():
        head = [r.run, r.server_id, r.cell_id] if len(cols) == 3 else [r.server_id, r.cell_id]
        t.add(*head, fmt.status(r.status), fmt.num(r.tok_s_per_user), fmt.num(r.tok_s_per_gpu), fmt.ms(r.ttft_ms))
    return t
