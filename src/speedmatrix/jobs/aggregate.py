"""Aggregation: every cell's JSON and loop verdicts into ``matrix.parquet`` and ``requests.parquet``."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from .. import workloads
from ..core import atomic
from ..judge import decide
from ..measure import slo, stats

TELEMETRY_COLUMNS = [
    "gpu_name", "gpu_count", "gpu_power_w", "gpu_energy_j", "gpu_energy_per_output_token_j", "gpu_sm_util_pct",
    "gpu_mem_util_pct", "gpu_sm_clock_mhz", "gpu_mem_clock_mhz", "gpu_pcie_rx_mb_s", "gpu_pcie_tx_mb_s",
    "gpu_temp_c_max", "gpu_nvlink_tx_mb_s", "gpu_nvlink_rx_mb_s",
]

# matrix column -> the cell result's figure it takes its interval and CV from
SPREAD = {"total_tok_s": "output_throughput", "prompt_tok_s": "prompt_tok_s", "ttft_ms": "median_ttft_ms",
          "itl_ms": "median_tbt_ms"}
SPREAD_COLUMNS = [f"{col}_{part}" for col in SPREAD for part in ("ci_low", "ci_high", "cv")]


def spread_fields(res: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for col, key in SPREAD.items():
        ci = res.get(f"{key}_ci95")
        out[f"{col}_ci_low"], out[f"{col}_ci_high"] = (ci[0], ci[1]) if ci else (None, None)
        out[f"{col}_cv"] = res.get(f"{key}_cv")
    reps = res.get("repeat_figures") or []
    out["total_tok_s_repeats"] = [r.get("output_throughput") for r in reps] or None
    out["ttft_ms_repeats"] = [r.get("median_ttft_ms") for r in reps] or None
    return out


MATRIX_COLUMNS = [
    "experiment", "server_id", "cell_id", "model", "spec_tokens", "spec_method", "workload", "context_tokens",
    "concurrency",
    "status", "total_tok_s", "per_request_tok_s", "ttft_ms", "itl_ms", "avg_active_requests",
    "completed_requests", "output_tokens", "measured_s", "prompt_tok_s", "spec_acceptance_rate",
    "spec_acceptance_length", "prefix_cache_hit_rate", "cached_prompt_share", "loop_fraction", "suspected_fraction",
    "loop_status_policy", "error", "vllm_version", "runtime_ref",
    # beyond the contract: what a reader of the matrix needs to trust a number
    "max_tokens", "duration_s", "failed_requests", "num_requests", "p90_ttft_ms", "p99_ttft_ms",
    "p90_itl_ms", "p99_itl_ms", "median_chunk_itl_ms", "kv_cache_size_tokens", "needed_kv_tokens",
    "server_generation_tokens", "preemptions", "spec_decode_per_position_acceptance", "server_start_id",
    "started_at", "hostname", "slurm_job_id",
    "mean_ttft_ms", "p95_ttft_ms", "corpus", "shared_prefix", "ignore_eos", "server_metrics", "token_count_gap",
    "server_running_mean", "prefix_cache_hits", "prefix_cache_queries",
    # loops (docs/decisions/0003): the figure over the requests that did not loop, and trust in acceptance
    "looped_requests", "total_tok_s_non_looping", "spec_acceptance_reliable", "spec_acceptance_client",
    "spec_acceptance_before_loop", "loops_after_natural_end",
    "prompt_format",
    # seed experiments: the sweep a server config belongs to and its point ("path=label; ..."), the API used
    "sweep", "sweep_point", "api",
    # repeats: the main figures are the median of a cell's repeats; their 95 % interval (Student's t
    # for the mean of the repeats) and coefficient of variation; each repeat's figure; why a status
    "repeats", *SPREAD_COLUMNS, "total_tok_s_repeats", "ttft_ms_repeats", "status_reason",
    # decode: the steady part of the window (total_tok_s) against the whole window; how the streams came
    "total_tok_s_window", "steady_fraction", "delivery", "delivery_burst_share",
    # a GPU pool: the pool's GPUs the server held, and the other cells that measured during this one
    "server_gpus", "ran_beside",
    # decisions: the server's GPUs (tensor x pipeline parallel; 0 on the CPU) and output tok/s per
    # GPU (the whole server's on the CPU); on the Pareto frontier of tok/s per user against it; the cell's
    # first latency target (a search cell's: its own) with the share of requests that met it, whether it holds
    # at its percentile, and the goodput of the requests that met it (every target: decisions.parquet)
    "gpus", "tok_s_per_gpu", "tok_s_per_user", "on_pareto", "slo", "slo_met", "slo_attainment", "goodput_rps",
    "goodput_tok_s", "goodput_tok_s_ci_low", "goodput_tok_s_ci_high",
    # GPU telemetry over the measurement window (NVML; null where absent) and the decode roofline
    *TELEMETRY_COLUMNS, "gpu_per_gpu", "model_weights_gib",
    # each workload kind's own columns (prefix cache: the cold pass; decode: the roofline)
    *(c for name in workloads.names() for c in workloads.get(name).matrix_columns),
]


# matrix columns read as they are from a cell's JSON: column -> key, by the part of the JSON it is in
FROM_RESULT = {
    "total_tok_s_window": "output_throughput_window", "steady_fraction": "steady_fraction",
    "delivery_burst_share": "delivery_burst_share", "total_tok_s": "output_throughput",
    "per_request_tok_s": "per_request_tok_s", "ttft_ms": "median_ttft_ms", "itl_ms": "median_tbt_ms",
    "avg_active_requests": "avg_active_requests", "completed_requests": "completed",
    "output_tokens": "total_output_tokens", "measured_s": "measured_s", "prompt_tok_s": "prompt_tok_s",
    "spec_acceptance_rate": "spec_decode_acceptance_rate", "spec_acceptance_length": "spec_decode_acceptance_length",
    "prefix_cache_hit_rate": "prefix_cache_hit_rate", "cached_prompt_share": "cached_prompt_share",
    "error": "error", "failed_requests": "failed",
    "num_requests": "num_requests", "p90_ttft_ms": "p90_ttft_ms", "p99_ttft_ms": "p99_ttft_ms",
    "p90_itl_ms": "p90_tbt_ms", "p99_itl_ms": "p99_tbt_ms", "median_chunk_itl_ms": "median_itl_ms",
    "kv_cache_size_tokens": "kv_cache_size_tokens", "needed_kv_tokens": "needed_kv_tokens",
    "server_generation_tokens": "server_generation_tokens", "preemptions": "preemptions",
    "spec_decode_per_position_acceptance": "spec_decode_per_position_acceptance", "started_at": "started_at",
    "mean_ttft_ms": "mean_ttft_ms", "p95_ttft_ms": "p95_ttft_ms", "ignore_eos": "ignore_eos",
    "server_metrics": "server_metrics", "token_count_gap": "token_count_gap",
    "server_running_mean": "server_running_mean", "prefix_cache_hits": "prefix_cache_hits",
    "prefix_cache_queries": "prefix_cache_queries", "prompt_format": "prompt_format",
    **{k: k for k in TELEMETRY_COLUMNS},
}
FROM_LOOPS = {
    "status_reason": "status_reason", "loop_fraction": "loop_fraction", "suspected_fraction": "suspected_fraction",
    "loop_status_policy": "policy", "looped_requests": "looped_requests",
    "total_tok_s_non_looping": "output_throughput_non_looping", "spec_acceptance_reliable": "spec_acceptance_reliable",
    "spec_acceptance_client": "spec_acceptance_client", "spec_acceptance_before_loop": "spec_acceptance_before_loop",
    "loops_after_natural_end": "loops_after_natural_end",
}
FROM_PROVENANCE = {
    "vllm_version": "vllm_version", "runtime_ref": "runtime_ref", "server_start_id": "server_start_id",
    "hostname": "hostname", "model_weights_gib": "model_weights_gib",
}


def matrix_row(cell: dict[str, Any], loops: dict[str, Any]) -> dict[str, Any]:
    """One cell's row of the matrix, from its JSON and its loop verdict."""
    spec, res, prov, srv = cell["cell"], cell["result"], cell["provenance"], cell["server"]
    kind = workloads.get(spec["workload"])
    return {
        "experiment": cell["experiment"],
        "server_id": spec["server_id"],
        "cell_id": spec["cell_id"],
        "workload": spec["workload"],
        "context_tokens": spec["context_tokens"],
        "concurrency": spec["concurrency"],
        "max_tokens": spec["max_tokens"],
        "duration_s": spec.get("duration_s"),
        "repeats": spec.get("repeats", 1),  # a cell measured before repeats existed was measured once
        "corpus": spec.get("corpus", "prose"),  # the same, before corpora
        "shared_prefix": spec.get("shared_prefix"),
        "model": srv["model"],
        "spec_tokens": srv["spec_tokens"],
        "spec_method": srv.get("spec_method"),  # before it was recorded: None
        "sweep": srv.get("sweep"),
        "sweep_point": "; ".join(f"{k}={v['label']}" for k, v in (srv.get("sweep_values") or {}).items()) or None,
        "status": loops["cell_status"],
        "api": res.get("api", "completions"),  # before the chat API, every cell's
        **spread_fields(res),
        **{col: res.get(key) for col, key in FROM_RESULT.items()},
        **{col: loops.get(key) for col, key in FROM_LOOPS.items()},
        **{col: prov.get(key) for col, key in FROM_PROVENANCE.items()},
        "server_gpus": ",".join(prov.get("server_gpus") or []) or None,
        "ran_beside": "; ".join(f"{b['server_id']}/{b['cell']}" for b in res.get("beside") or []) or None,
        # decided here from the measured share (a new threshold re-derives it, never re-measures)
        "delivery": stats.delivery_kind(res.get("delivery_burst_share")),
        "slurm_job_id": (prov.get("scheduler") or {}).get("SLURM_JOB_ID"),
        "gpu_per_gpu": json.dumps(res["gpu_per_gpu"]) if res.get("gpu_per_gpu") else None,
        **kind.matrix_fields(spec, res, prov),
    }


DECISION_COLUMNS = [
    "experiment", "server_id", "cell_id", "workload", "context_tokens", "concurrency", "spec_tokens", "sweep",
    "sweep_point", "status", "slo", "slo_definition", "percentile", "ttft_limit_ms", "tpot_limit_ms",
    "e2e_limit_ms", "judged_requests", "met_requests", "attainment", "slo_met", "p_ttft_ms", "p_tpot_ms",
    "p_e2e_ms", "goodput_rps", "goodput_tok_s", "goodput_tok_s_ci_low", "goodput_tok_s_ci_high",
    "goodput_repeats",
]


def cell_decisions(cell: dict[str, Any], row: dict[str, Any], table: pd.DataFrame,
                   targets: list[slo.Target]) -> list[dict[str, Any]]:
    """Every target the cell's kind is judged on, over its requests (speedmatrix.measure.slo)."""
    kind = workloads.get(cell["cell"]["workload"])
    chosen = kind.slo_targets(cell["cell"], targets)
    if not chosen or not len(table) or row["status"] == "over_capacity":
        return []
    phase, window = kind.slo_scope(cell["result"])
    ident = {k: row[k] for k in DECISION_COLUMNS[:10]}
    if kind.searches:  # the load the search found, not its upper bound
        ident["concurrency"] = cell["result"].get("slo_max_concurrency")
    return [{**ident, **r} for r in slo.for_cell(table, cell["result"], chosen, phase, window)]


def build(cells: Iterable[str | Path], loops: Iterable[str | Path], requests: Iterable[str | Path],
          matrix_out: str | Path, requests_out: str | Path, decisions_out: str | Path | None = None,
          targets: list[slo.Target] | None = None, gpus: dict[str, int] | None = None) -> pd.DataFrame:
    """matrix.parquet, requests.parquet and (with ``decisions_out``) decisions.parquet: one row per cell
    and latency target. ``gpus``: each server config's GPUs (tok/s per GPU and the Pareto frontier)."""
    cells, loops, requests = list(cells), list(loops), list(requests)
    if not (len(cells) == len(loops) == len(requests)):
        raise ValueError("aggregate needs one loop verdict and one request table per cell")
    rows, tables, decided = [], [], []
    for c_path, l_path, r_path in zip(cells, loops, requests):
        cell, verdicts = atomic.read_json(c_path), atomic.read_json(l_path)
        row = matrix_row(cell, verdicts)
        table = pd.read_parquet(r_path)
        if len(table):
            per = pd.DataFrame(verdicts["requests"])
            if len(per):
                table = table.merge(per, on="request_index", how="left")
            tables.append(table)
        found = cell_decisions(cell, row, table, targets or [])
        if found:
            first = found[0]
            row.update(slo=first["slo"], slo_met=first["slo_met"], slo_attainment=first["attainment"],
                       **{k: first[k] for k in ("goodput_rps", "goodput_tok_s", "goodput_tok_s_ci_low",
                                                "goodput_tok_s_ci_high")})
        decided += found
        rows.append(row)
    matrix = pd.DataFrame(rows, columns=MATRIX_COLUMNS)
    matrix["gpus"] = matrix["server_id"].map(gpus or {})
    matrix["tok_s_per_gpu"] = decide.per_gpu(matrix["total_tok_s"], matrix["gpus"])
    matrix["tok_s_per_user"] = decide.per_user(matrix["total_tok_s"], matrix["avg_active_requests"])
    points = decide.frontier(decide.pareto_points(matrix))
    matrix["on_pareto"] = pd.array(matrix.index.map(points["on_frontier"].to_dict()) if len(points)
                                   else [None] * len(matrix), dtype="boolean")
    matrix["slo_met"] = pd.array(matrix["slo_met"].where(matrix["slo_met"].notna(), None), dtype="boolean")
    matrix = matrix.sort_values(["server_id", "workload", "context_tokens", "concurrency"], kind="stable")
    matrix.to_parquet(matrix_out, index=False)
    reqs = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    reqs.to_parquet(requests_out, index=False)
    if decisions_out is not None:
        pd.DataFrame(decided, columns=DECISION_COLUMNS).to_parquet(decisions_out, index=False)
    return matrix
