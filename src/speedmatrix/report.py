"""The report: tables shaped like the seeds' (seed 002's prefill, sustained-decode and full tables)."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

STATUS_LABEL = {"valid": "Valid", "looped": "Looped", "over_capacity": "Over capacity", "error": "Error"}
FOOTNOTE = (
    "Looped: the model kept repeating the same text, so this measurement is discarded under the configured "
    "policy. Over capacity: not run because this many requests at this context would exceed the server's KV "
    "cache (decided from the live server's `kv_cache_size_tokens`)."
)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def fmt_num(v: Any) -> str:
    """Like the seeds: 31.5K, 6,473.0, 95.7."""
    if _missing(v):
        return "—"
    v = float(v)
    if abs(v) >= 10_000:
        return f"{v / 1000:.1f}K"
    return f"{v:,.1f}"


def fmt_ms(v: Any) -> str:
    return "—" if _missing(v) else f"{float(v):,.0f} ms" if float(v) >= 100 else f"{float(v):,.1f} ms"


def fmt_ctx(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens >= 1024 and tokens % 1024 == 0 else str(tokens)


def fmt_int(v: Any) -> str:
    return "—" if _missing(v) else f"{int(v):,}"


def decode_table(m: pd.DataFrame) -> str:
    """Seed 002's "Sustained decode" table: rows = context, columns = concurrency (first repeat)."""
    d = m[(m["workload"] == "decode") & (m["repeat"].fillna(1) == 1)]
    d = d.assign(_p=(d["corpus"] != "prose")).sort_values("_p", kind="stable")  # prose first where both
    concs = sorted(d["concurrency"].unique())
    lines = ["| Context | " + " | ".join(str(c) for c in concs) + " |", "|---" * (len(concs) + 1) + "|"]
    for ctx in sorted(d["context_tokens"].unique()):
        cells = []
        for c in concs:
            row = d[(d["context_tokens"] == ctx) & (d["concurrency"] == c)]
            if row.empty:
                cells.append("")
                continue
            r = row.iloc[0]
            cells.append(fmt_num(r["total_tok_s"]) if r["status"] == "valid" else STATUS_LABEL.get(r["status"],
                                                                                               r["status"]))
        lines.append(f"| {fmt_ctx(int(ctx))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def prefill_table(m: pd.DataFrame) -> str:
    p = m[m["workload"] == "prefill"]
    lines = ["| Context | prompt tok/s | TTFT |", "|---|---|---|"]
    for r in p.sort_values("context_tokens").itertuples():
        lines.append(f"| {fmt_ctx(int(r.context_tokens))} | {fmt_num(r.prompt_tok_s)} | {fmt_ms(r.ttft_ms)} |")
    return "\n".join(lines)


def latency_table(m: pd.DataFrame) -> str:
    """Seed 000's single-request profile: TTFT across input sizes."""
    p = m[m["workload"] == "latency"]
    lines = ["| Input tokens | Median TTFT | Mean TTFT | p95 TTFT | tok/s (one request) |", "|---|---|---|---|---|"]
    for r in p.sort_values("context_tokens").itertuples():
        lines.append(f"| {fmt_int(r.context_tokens)} | {fmt_ms(r.ttft_ms)} | {fmt_ms(r.mean_ttft_ms)} | "
                     f"{fmt_ms(r.p95_ttft_ms)} | {fmt_num(r.per_request_tok_s)} |")
    return "\n".join(lines)


def capacity_table(m: pd.DataFrame) -> str:
    """Seed 003's capacity rows: N requests at concurrency c with a token cap."""
    p = m[m["workload"] == "capacity"]
    lines = ["| Context | Concurrency | Status | Output tok/s | TTFT p50 | TTFT p95 | Completed |",
             "|---|---|---|---|---|---|---|"]
    for r in p.sort_values(["context_tokens", "concurrency"]).itertuples():
        ok = r.status != "over_capacity"
        lines.append(f"| {fmt_ctx(int(r.context_tokens))} | {int(r.concurrency)} | "
                     f"{STATUS_LABEL.get(r.status, r.status)} | {fmt_num(r.total_tok_s) if ok else '—'} | "
                     f"{fmt_ms(r.ttft_ms) if ok else '—'} | {fmt_ms(r.p95_ttft_ms) if ok else '—'} | "
                     f"{fmt_int(r.completed_requests) if ok else '—'} |")
    return "\n".join(lines)


def _pct(v: Any) -> str:
    return "—" if _missing(v) else f"{float(v):.1%}"


def prefix_cache_table(m: pd.DataFrame) -> str:
    """Seed 000's prefix-cache table: a cold and a warm row per sharing ratio."""
    p = m[m["workload"] == "prefix_cache"]
    lines = ["| Scenario | Context | Concurrency | Mean TTFT | Median TTFT | tok/s | Token hit rate |",
             "|---|---|---|---|---|---|---|"]
    for r in p.sort_values(["shared_prefix", "context_tokens", "concurrency"],
                           ascending=[False, True, True]).itertuples():
        share = f"{float(r.shared_prefix):.1%}".replace(".0%", "%")
        ctx, conc = fmt_ctx(int(r.context_tokens)), int(r.concurrency)
        if r.status == "over_capacity":
            lines.append(f"| Shared prefix {share} | {ctx} | {conc} | Over capacity | | | |")
            continue
        lines.append(f"| Shared prefix {share} — cold | {ctx} | {conc} | {fmt_ms(r.cold_mean_ttft_ms)} | "
                     f"{fmt_ms(r.cold_ttft_ms)} | {fmt_num(r.cold_total_tok_s)} | "
                     f"{_pct(r.cold_prefix_cache_hit_rate)} |")
        lines.append(f"| Shared prefix {share} — warm | {ctx} | {conc} | {fmt_ms(r.mean_ttft_ms)} | "
                     f"{fmt_ms(r.ttft_ms)} | {fmt_num(r.total_tok_s)} | {_pct(r.prefix_cache_hit_rate)} |")
    return "\n".join(lines)


PHASE_ORDER = {"prefill": 0, "latency": 1, "decode": 2, "capacity": 3, "prefix_cache": 4}


def by_phase(m: pd.DataFrame, *then: str) -> pd.DataFrame:
    """Rows in the seeds' order: prefill, latency, decode, capacity, prefix cache; then by ``then``."""
    return m.assign(_o=m["workload"].map(PHASE_ORDER)).sort_values(["_o", *then], kind="stable")


def fmt_whole(v: Any, fmt: str = "{:,.0f}") -> str:
    return "—" if _missing(v) else fmt.format(float(v))


def full_table(m: pd.DataFrame) -> str:
    head = ("| Phase | Context | Requests at once | Status | Total tok/s | Per request tok/s | TTFT | "
            "Time between tokens | Average active requests | Completed requests | Output tokens | Measured for | "
            "Loop fraction | Total tok/s without looping requests |")
    lines = [head, "|---" * 14 + "|"]
    for r in by_phase(m, "context_tokens", "concurrency").itertuples():
        measured = r.status not in ("over_capacity",)
        phase = {"prefill": "Prefill", "decode": "Sustained decode", "capacity": "Capacity",
                 "latency": "Latency", "prefix_cache": "Prefix cache (warm)"}.get(r.workload, r.workload)
        tok = r.prompt_tok_s if r.workload == "prefill" else r.total_tok_s
        lines.append("| " + " | ".join([
            phase, fmt_ctx(int(r.context_tokens)), str(int(r.concurrency)), STATUS_LABEL.get(r.status, r.status),
            fmt_num(tok) if measured else "—",
            fmt_num(r.per_request_tok_s) if measured else "—",
            fmt_ms(r.ttft_ms) if measured else "—",
            fmt_ms(r.itl_ms) if measured else "—",
            fmt_num(r.avg_active_requests) if measured else "—",
            fmt_int(r.completed_requests) if measured else "—",
            fmt_int(r.output_tokens) if measured else "—",
            (f"{float(r.measured_s):.1f} s" if not _missing(r.measured_s) else "—") if measured else "—",
            "—" if _missing(r.loop_fraction) else f"{float(r.loop_fraction):.0%}",
            fmt_num(r.total_tok_s_non_looping) if measured and r.workload != "prefill" else "—",
        ]) + " |")
    return "\n".join(lines)


def _delta(a: Any, b: Any) -> str:
    """b against a, as a percentage (seed 003: "35.7% faster")."""
    if _missing(a) or _missing(b) or float(a) == 0:
        return "—"
    return f"{(float(b) / float(a) - 1):+.1%}"


def _vary_header(path: str) -> str:
    return {"speculative.num_speculative_tokens": "Spec tokens", "args.max-num-seqs": "max-num-seqs",
            "args.max-num-batched-tokens": "batch", "env.VLLM_USE_V2_MODEL_RUNNER": "Runner",
            "model": "Model"}.get(path, path.split(".")[-1])


def _cell_label(r: Any) -> str:
    ctx = fmt_ctx(int(r.context_tokens))
    if r.workload in ("latency", "prefill"):
        return f"{ctx}-tok"
    return f"c{int(r.concurrency)} / {ctx}"


def sweep_table(m: pd.DataFrame, servers: list[Any]) -> str:
    """One row per point of a sweep (seed 000's sweep tables; seed 003's matched comparison).

    One cell per config: tok/s, mean TTFT and (with speculation) acceptance, as seed 000's
    speculative and max-num-seqs tables. Several latency cells: TTFT per input size and tok/s
    (seed 000's batched-tokens table). Several capacity cells: output tok/s per cell and the
    p95 TTFT of the largest, then each column's change against the first row (seed 003).
    """
    rows = [s for s in servers if (m["server_id"] == s.id).any()]
    if not rows:
        return "(no measurements)"
    paths = list(rows[0].sweep_values)
    heads = [_vary_header(pth) for pth in paths]
    valid = m[m["status"] != "over_capacity"]
    first = m[m["server_id"] == rows[0].id].sort_values(["workload", "context_tokens", "concurrency"])
    cells = list(first.itertuples())
    spec = any(s.spec_tokens for s in rows)

    def point(s):
        return [str(s.sweep_values[pth]["label"]) for pth in paths]

    def pick(sid, c):
        r = valid[(valid["server_id"] == sid) & (valid["cell_id"] == c.cell_id)]
        return None if r.empty else r.iloc[0]

    def status_or(r, text):
        if r is None:
            return "Over capacity"
        return text if r["status"] == "valid" else STATUS_LABEL.get(r["status"], r["status"])

    lines = []
    if len(cells) == 1:
        c = cells[0]
        cols = ["tok/s", "Mean TTFT", "Median TTFT"] + (["Acceptance rate", "Accept length"] if spec else [])
        cols += [f"tok/s vs {'/'.join(point(rows[0]))}"]
        lines += ["| " + " | ".join(heads + cols) + " |", "|---" * (len(heads) + len(cols)) + "|"]
        base = pick(rows[0].id, c)
        for s in rows:
            r = pick(s.id, c)
            tok = None if r is None else r["total_tok_s"]
            vals = [status_or(r, fmt_num(tok)), "—" if r is None else fmt_ms(r["mean_ttft_ms"]),
                    "—" if r is None else fmt_ms(r["ttft_ms"])]
            if spec:
                vals += ["—" if r is None else _pct(r["spec_acceptance_rate"]),
                         "—" if r is None else ("—" if _missing(r["spec_acceptance_length"])
                                                else f"{float(r['spec_acceptance_length']):.2f}")]
            vals.append(_delta(None if base is None else base["total_tok_s"], tok))
            lines.append("| " + " | ".join(point(s) + vals) + " |")
        return "\n".join(lines)
    if all(c.workload in ("latency", "prefill") for c in cells):
        cols = [f"{_cell_label(c)} TTFT" for c in cells] + ["tok/s"] + (["Acceptance rate"] if spec else [])
        lines += ["| " + " | ".join(heads + cols) + " |", "|---" * (len(heads) + len(cols)) + "|"]
        for s in rows:
            rs = [pick(s.id, c) for c in cells]
            vals = [status_or(r, fmt_ms(r["ttft_ms"]) if r is not None else "") for r in rs]
            tok = [r["per_request_tok_s"] for r in rs if r is not None and not _missing(r["per_request_tok_s"])]
            vals.append(fmt_num(sum(tok) / len(tok)) if tok else "—")
            if spec:
                acc = [r["spec_acceptance_rate"] for r in rs if r is not None and not _missing(r["spec_acceptance_rate"])]
                vals.append(_pct(sum(acc) / len(acc)) if acc else "—")
            lines.append("| " + " | ".join(point(s) + vals) + " |")
        return "\n".join(lines)
    # capacity-shaped: throughput per cell, the largest cell's p95 TTFT, then the changes against the first row
    last = max(cells, key=lambda c: (c.concurrency, c.context_tokens))
    cols = [_cell_label(c) for c in cells] + [f"{_cell_label(last)} p95 TTFT"]
    lines += ["| " + " | ".join(heads + cols) + " |", "|---" * (len(heads) + len(cols)) + "|"]
    table = {}
    for s in rows:
        rs = [pick(s.id, c) for c in cells]
        table[s.id] = rs
        vals = [status_or(r, fmt_num(r["total_tok_s"]) if r is not None else "") for r in rs]
        rl = pick(s.id, last)
        vals.append("—" if rl is None else fmt_ms(rl["p95_ttft_ms"]))
        lines.append("| " + " | ".join(point(s) + vals) + " |")
    ref = "/".join(point(rows[0]))
    lines += ["", f"Change against {ref} (output tok/s; p95 TTFT: lower is better):", "",
              "| " + " | ".join(heads + cols) + " |", "|---" * (len(heads) + len(cols)) + "|"]
    for s in rows:
        vals = [_delta(None if a is None else a["total_tok_s"], None if b is None else b["total_tok_s"])
                for a, b in zip(table[rows[0].id], table[s.id])]
        a, b = pick(rows[0].id, last), pick(s.id, last)
        vals.append(_delta(None if a is None else a["p95_ttft_ms"], None if b is None else b["p95_ttft_ms"]))
        lines.append("| " + " | ".join(point(s) + vals) + " |")
    return "\n".join(lines)


def spread_table(m: pd.DataFrame) -> str:
    """Cells measured several times (decode ``repeats``): each measurement and the spread."""
    d = m[(m["workload"] == "decode") & (m["status"] == "valid")]
    groups = [g for _, g in d.groupby(["server_id", "context_tokens", "concurrency", "corpus"]) if len(g) > 1]
    if not groups:
        return ""
    lines = ["| Server config | Context | Requests at once | Corpus | Runs | Total tok/s (each run) | Mean | "
             "Spread (max-min)/mean | Median TTFT (each run) |", "|---|---|---|---|---|---|---|---|---|"]
    for g in groups:
        g = g.sort_values("repeat")
        tok = g["total_tok_s"].astype(float)
        spread = (tok.max() - tok.min()) / tok.mean() if tok.mean() else float("nan")
        lines.append(f"| {g.server_id.iloc[0]} | {fmt_ctx(int(g.context_tokens.iloc[0]))} | "
                     f"{int(g.concurrency.iloc[0])} | {g.corpus.iloc[0]} | {len(g)} | "
                     f"{', '.join(fmt_num(v) for v in tok)} | "
                     f"{fmt_num(tok.mean())} | {spread:.1%} | {', '.join(fmt_ms(v) for v in g.ttft_ms)} |")
    return "\n".join(lines)


def _rows_with(m: pd.DataFrame, column: str) -> pd.DataFrame:
    """The rows where ``column`` has a value (none when the matrix lacks the column: an older run)."""
    return m[m[column].notna()] if column in m else m.iloc[0:0]


def gpu_table(m: pd.DataFrame) -> str:
    """NVML telemetry over each cell's measurement window."""
    d = _rows_with(m, "gpu_name")
    if d.empty:
        return ""
    lines = ["| Phase | Context | Requests at once | Power (W) | Energy / output token (J) | SM util | Mem util | "
             "SM clock (MHz) | Mem clock (MHz) | PCIe rx / tx (MB/s) | Max temp (°C) |",
             "|---" * 11 + "|"]
    f = fmt_whole
    for r in by_phase(d, "context_tokens", "concurrency", "repeat").itertuples():
        lines.append(f"| {r.workload} | {fmt_ctx(int(r.context_tokens))} | {int(r.concurrency)} | "
                     f"{f(r.gpu_power_w)} | {f(r.gpu_energy_per_output_token_j, '{:.3f}')} | "
                     f"{f(r.gpu_sm_util_pct)} % | {f(r.gpu_mem_util_pct)} % | {f(r.gpu_sm_clock_mhz)} | "
                     f"{f(r.gpu_mem_clock_mhz)} | {f(r.gpu_pcie_rx_mb_s)} / {f(r.gpu_pcie_tx_mb_s)} | "
                     f"{f(r.gpu_temp_c_max)} |")
    return "\n".join(lines)


def per_gpu_table(m: pd.DataFrame) -> str:
    """Several GPUs (tensor parallel): each GPU's power, SM utilisation and PCIe traffic per cell, like seed
    000's per-phase table."""
    d = _rows_with(m, "gpu_count")
    d = d[d["gpu_count"] > 1]
    if d.empty:
        return ""
    n = int(d["gpu_count"].max())
    heads = ["Phase", "Context", "Requests at once"]
    for g in range(n):
        heads += [f"GPU{g} power (W)", f"GPU{g} SM util", f"GPU{g} PCIe rx / tx (MB/s)"]
    lines = ["| " + " | ".join(heads) + " |", "|---" * len(heads) + "|"]
    f = fmt_whole
    for r in by_phase(d, "context_tokens", "concurrency").itertuples():
        per = json.loads(r.gpu_per_gpu) if isinstance(r.gpu_per_gpu, str) else []
        vals = [r.workload, fmt_ctx(int(r.context_tokens)), str(int(r.concurrency))]
        for g in range(n):
            x = per[g] if g < len(per) else {}
            vals += [f(x.get("power_w_mean")), f"{f(x.get('sm_util_pct_mean'))} %",
                     f"{f(x.get('pcie_rx_mb_s_mean'))} / {f(x.get('pcie_tx_mb_s_mean'))}"]
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines)


def roofline_table(m: pd.DataFrame) -> str:
    """Decode at concurrency 1: the memory-bandwidth bound per token against the measured time."""
    d = _rows_with(m, "roofline_pct")
    if d.empty:
        return ""
    lines = ["| Context | Run | Measured time between tokens | Bound (weights / peak bandwidth) | "
             "Weights on a GPU | Peak bandwidth | Of the roofline |", "|---|---|---|---|---|---|---|"]
    for r in d.sort_values(["context_tokens", "repeat"]).itertuples():
        lines.append(f"| {fmt_ctx(int(r.context_tokens))} | {int(r.repeat)} | {fmt_ms(r.itl_ms)} | "
                     f"{float(r.roofline_bound_ms):.2f} ms | {float(r.model_weights_gib):.1f} GiB | "
                     f"{float(r.roofline_peak_bw_tb_s):g} TB/s | {float(r.roofline_pct):.1f} % |")
    return "\n".join(lines)


def reference_table(refs: list[dict[str, Any]]) -> str:
    lines = ["| Server config | Cell | Rounds | Output tok/s: speedmatrix / vllm bench serve | Δ | "
             "Median TTFT | Δ | Median time between tokens | Δ |", "|---|---|---|---|---|---|---|---|---|"]
    for d in refs:
        a, b, diff = d["medians"]["speedmatrix"], d["medians"]["vllm_bench_serve"], d["difference_pct"]

        def pct(v):
            return "—" if v is None else f"{v:+.1f} %"
        lines.append(f"| {d['server_id']} | {d['cell']['cell_id']} | {d['rounds']} | "
                     f"{fmt_num(a['output_throughput'])} / {fmt_num(b['output_throughput'])} | "
                     f"{pct(diff['output_throughput'])} | {fmt_ms(a['median_ttft_ms'])} / "
                     f"{fmt_ms(b['median_ttft_ms'])} | {pct(diff['median_ttft_ms'])} | "
                     f"{fmt_ms(a['median_itl_ms'])} / {fmt_ms(b['median_itl_ms'])} | {pct(diff['median_itl_ms'])} |")
    return "\n".join(lines)


def gates_table(gates: list[dict[str, Any]]) -> str:
    """Seed 003's quality gates: one row per server config, PASS or FAIL with the reason."""
    names = [g for g in ("smoke", "structured_json", "tool_calls") if any(d["gate"] == g for d in gates)]
    label = {"smoke": "Smoke", "structured_json": "Structured JSON", "tool_calls": "Tool calls"}
    lines = ["| Server config | " + " | ".join(label[g] for g in names) + " |", "|---" * (len(names) + 1) + "|"]
    for sid in sorted({d["server_id"] for d in gates}):
        vals = []
        for g in names:
            d = next((d for d in gates if d["server_id"] == sid and d["gate"] == g), None)
            if d is None:
                vals.append("—")
                continue
            text = "PASS" if d["passed"] else f"FAIL: {str(d.get('reason'))[:80]}"
            if g == "tool_calls" and "valid" in d:
                text += f" ({d['valid']}/{d['count']})" if d["passed"] else ""
            vals.append(text.replace("|", "/"))
        lines.append(f"| {sid} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def loop_policy_text(m: pd.DataFrame, settings: dict[str, Any]) -> str:
    policy = settings.get("policy", "any")
    rule = {"any": "one looping request marks a cell Looped (seed 002's rule)",
            "fraction": f"a cell is Looped when more than {float(settings.get('max_loop_fraction', 0.1)):.0%} of "
                        "its requests loop",
            "flag_only": "looping is reported and never changes a cell's status"}.get(policy, policy)
    sent = m[m.status != "over_capacity"]
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
    if lock.get("image_ref"):
        out = [f"- runtime: {lock.get('runtime')} image `{lock.get('image')}` pinned to `{lock.get('image_ref')}` "
               f"(resolved {lock.get('pinned_at')})"]
    elif lock.get("command"):
        out = [f"- runtime: `{' '.join(lock['command'])}` ({lock.get('vllm_version')})"]
    else:
        out = [
            f"- vLLM: {lock.get('vllm_distribution')} {lock.get('vllm_version')} · torch {lock.get('torch_version')}"
            f" · Python {lock.get('python_version')} · {lock.get('platform')}",
            f"- runtime: `{lock.get('runtime_ref')}` (package set sha256 `{str(lock.get('packages_sha256'))[:16]}…`)",
        ]
    for name, m in ((models_lock or {}).get("models") or {}).items():
        if m.get("source") == "huggingface":
            pin = "" if m.get("pinned") else f" (from `{m.get('revision_requested')}`)"
            out.append(f"- model `{name}`: {m['repo']} at commit `{m['revision']}`{pin}, {len(m['files'])} files")
        else:
            out.append(f"- model `{name}`: synthesized `{m.get('preset')}` ({m.get('weights', 'random weights')})")
    return out


def render(matrix: pd.DataFrame, startups: list[dict[str, Any]], lock: dict[str, Any], charts: dict[str, str],
           experiment: str, description: str = "", loop_settings: dict[str, Any] | None = None,
           sweeps: list[tuple[dict[str, Any], list[Any]]] | None = None, gates: list[dict[str, Any]] | None = None,
           models_lock: dict[str, Any] | None = None, references: list[dict[str, Any]] | None = None) -> str:
    out = [f"# {experiment}", ""]
    if description:
        out += [description.strip(), ""]
    out += [
        *runtime_lines(lock, models_lock),
        "",
        "## Servers",
        "",
        "| Server config | Spec tokens | Start-up | KV cache (tokens) | Max concurrency at max-model-len | vLLM |",
        "|---|---|---|---|---|---|",
    ]
    spec_by_server = matrix.groupby("server_id")["spec_tokens"].first().to_dict()
    for s in startups:
        mc = s.get("max_concurrency")
        out.append(
            f"| {s['server_id']} | {spec_by_server.get(s['server_id'], '—')} | {s.get('startup_seconds', 0):.1f} s | "
            f"{fmt_int(s.get('kv_cache_size_tokens'))} | {'—' if mc is None else f'{mc:.2f}x'} | "
            f"{s.get('vllm_version')} |"
        )
    if gates:
        out += ["", "## Quality gates", "",
                "Smoke (a short answer that ends by itself), structured JSON (an answer under a JSON schema) and "
                "tool calls (every request calls the offered tool with valid arguments), against each server "
                "config. A failed gate is shown here, never dropped.", "", gates_table(gates)]
    for sweep, servers in sweeps or []:
        out += ["", f"## {sweep.get('title') or 'Sweep ' + sweep['id']}", "",
                f"Sweep `{sweep['id']}`: " + "; ".join(f"`{k}` over {', '.join(map(str, (v if isinstance(v, list) else list(v))))}"
                                                       for k, v in sweep["vary"].items()) + ".", "",
                sweep_table(matrix, servers)]
    synthesized = [n for n, m in ((models_lock or {}).get("models") or {}).items() if m.get("source") == "synthesize"]
    if synthesized:
        out += ["", f"Models with random weights ({', '.join(synthesized)}): the serving speed of their shape is "
                "real; their output, quality gates and speculative acceptance mean nothing."]
    spread = spread_table(matrix)
    if spread:
        out += ["", "## Run-to-run spread", "", "The same cell measured again (decode `repeats`), each run a new "
                "set of requests on the same server.", "", spread]
    if references:
        out += ["", "## Agreement with vllm bench serve", "",
                "The same shape measured on the same server by speedmatrix and by vLLM's own client "
                "(`vllm bench serve`, random dataset, --ignore-eos, greedy), alternately; medians of the rounds, "
                "Δ = speedmatrix against vLLM's.", "", reference_table(references)]
    roof = roofline_table(matrix)
    if roof:
        out += ["", "## Roofline (decode, one request)", "",
                "Each decode step at concurrency 1 reads every weight once: a token takes at least the weights "
                "on a GPU (vLLM's \"Model loading took\") over the GPU's peak memory bandwidth "
                "(src/speedmatrix/data/gpu_peaks.yaml). The last column is that bound as a share of the "
                "measured median time between tokens.", "", roof]
    gpu = gpu_table(matrix)
    if gpu:
        out += ["", "## GPU telemetry", "", "NVML, sampled every 0.2 s during each cell's requests only; power "
                "and PCIe summed over the server's GPUs, utilisation and clocks averaged.", "", gpu]
    per_gpu = per_gpu_table(matrix)
    if per_gpu:
        out += ["", "### Per GPU", "", "Each GPU of the tensor-parallel server, per cell (means over the cell's "
                "window; PCIe from NVML's 20 ms throughput samples). NVML's NVLink data counters are recorded "
                "(`gpu_nvlink_*`, `gpu_per_gpu` in matrix.parquet) but not shown: on two H200s their rates "
                "exceeded the links' bandwidth, so their unit or meaning is not settled (docs/gpu.md). Cells "
                "shorter than a second (prefill) have too few samples for these means.", "", per_gpu]
    out += ["", "## Loops", "", loop_policy_text(matrix, loop_settings or {})]
    for sid in sorted(matrix["server_id"].unique()):
        m = matrix[matrix["server_id"] == sid]
        out += ["", f"## Server config `{sid}`", ""]
        if (m["workload"] == "prefill").any():
            out += ["### Prefill", "", "prompt tok/s by context length", "", prefill_table(m), ""]
        if (m["workload"] == "decode").any():
            out += ["### Sustained decode", "",
                    "total tok/s · rows are context length, columns are simultaneous requests", "",
                    decode_table(m), "", FOOTNOTE, ""]
        if (m["workload"] == "latency").any():
            out += ["### Latency", "", "one request at a time, TTFT across input sizes", "", latency_table(m), ""]
        if (m["workload"] == "capacity").any():
            out += ["### Capacity", "", "a fixed number of requests at each concurrency, output capped", "",
                    capacity_table(m), ""]
        if (m["workload"] == "prefix_cache").any():
            out += ["### Prefix cache", "",
                    "a share of every prompt is the same text; the cold pass meets an empty cache for it, the warm "
                    "pass (new requests, same shared part) finds it cached. Token hit rate from the server's "
                    "prefix-cache counters.", "", prefix_cache_table(m), ""]
        out += ["### All measurements", "",
                "Latencies are medians. Total tok/s is output across all simultaneous requests.", "",
                full_table(m), ""]
    if charts:
        out += ["## Charts", ""]
        for title, png in charts.items():
            out += [f"![{title}]({png})", ""]
    return "\n".join(out)


def render_html(markdown_text: str, title: str) -> str:
    """A self-contained HTML page of the report (tables rendered, images linked)."""
    body, table = [], []

    def flush():
        if table:
            rows = [r for r in table if not set(r.replace("|", "").strip()) <= {"-"}]
            cells = [[html.escape(c.strip()) for c in r.strip().strip("|").split("|")] for r in rows]
            body.append("<table><thead><tr>" + "".join(f"<th>{c}</th>" for c in cells[0]) + "</tr></thead><tbody>"
                        + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in cells[1:])
                        + "</tbody></table>")
            table.clear()

    for line in markdown_text.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{html.escape(line.lstrip('#').strip())}</h{level}>")
        elif line.startswith("!["):
            alt_text, src = line[2:].split("](", 1)
            body.append(f'<p><img alt="{html.escape(alt_text)}" src="{html.escape(src.rstrip(")"))}"></p>')
        elif line.startswith("- "):
            body.append(f"<p>• {html.escape(line[2:])}</p>")
        elif line.strip():
            body.append(f"<p>{html.escape(line)}</p>")
    flush()
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse;"
             "margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")


def write(path_md: str | Path, path_html: str | Path, text: str, title: str) -> None:
    from . import atomic

    atomic.write_bytes(path_md, text.encode())
    atomic.write_bytes(path_html, render_html(text, title).encode())


def build(experiment_name: str, experiments_dir: str, matrix_path: str, lock_path: str, launch_paths: list[str],
          out: dict[str, str], gate_paths: list[str] = (), models_lock_path: str | None = None,
          reference_paths: list[str] = (), loop_settings: dict[str, Any] | None = None) -> None:
    """The report rule: the charts (HTML + PNG), report.md and report.html.

    ``loop_settings`` replaces the experiment's ``loops:`` in the text (a re-derivation under
    another policy: bench/gpu_run.py rederive)."""
    from . import atomic, charts, experiment

    exp = experiment.load(experiment_name, experiments_dir)
    matrix = pd.read_parquet(matrix_path)
    lock = atomic.read_json(lock_path)
    startups = []
    for p in launch_paths:
        startup = Path(p).parent / "startup.json"
        if startup.exists():
            startups.append(json.loads(startup.read_text()))
    chart_links = {}
    for name, (title, make) in charts.CHARTS.items():
        charts.save(make(matrix), out[f"{name}_html"], out[f"{name}_png"])
        if charts.has_data(name, matrix):
            chart_links[title] = str(Path(out[f"{name}_png"]).relative_to(Path(out["md"]).parent))
    sweeps = [(sw, [s for s in exp.servers if s.sweep == sw["id"]]) for sw in exp.sweeps]
    gates = [atomic.read_json(p) for p in gate_paths]
    models_lock = atomic.read_json(models_lock_path) if models_lock_path else None
    references = [atomic.read_json(p) for p in reference_paths]
    text = render(matrix, startups, lock, chart_links, exp.name, exp.raw.get("description", ""),
                  exp.loops if loop_settings is None else loop_settings, sweeps, gates, models_lock, references)
    write(out["md"], out["html"], text, exp.name)
    print(f"report: {out['md']}")
