"""Aggregation: every cell's JSON and loop verdicts into ``matrix.parquet`` and ``requests.parquet``."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from .. import workloads
from ..core import atomic, frames
from ..core.status import Status
from ..judge import decide
from ..measure import clientcheck, slo, stats, telemetry

TELEMETRY_COLUMNS = [
    "gpu_name", "gpu_count", "gpu_power_w", "gpu_energy_j", "gpu_energy_per_output_token_j", "gpu_sm_util_pct",
    "gpu_mem_util_pct", "gpu_sm_clock_mhz", "gpu_mem_clock_mhz", "gpu_pcie_rx_mb_s", "gpu_pcie_tx_mb_s",
    "gpu_temp_c_max", "gpu_nvlink_tx_mb_s", "gpu_nvlink_rx_mb_s",
]

# matrix column -> the cell result's figure it takes its interval and CV from
SPREAD = {"total_tok_s": "output_throughput", "prompt_tok_s": "prompt_tok_s", "ttft_ms": "median_ttft_ms",
          "tbt_ms": "median_tbt_ms"}
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


class C(NamedTuple):
    """A matrix column: its name, and where its value comes from. ``part`` and ``key``: read as it is from that
    part of the cell's JSON (``result``, the loop verdict ``loops``, ``provenance``), under ``key`` (default: the
    column's own name; where it differs, the JSON keeps ``vllm bench serve``'s name and the matrix the design's
    output contract's, and this is the one place that says so). No part: computed in ``matrix_row`` or by
    ``build``. docs/metrics.md is checked against this declaration (tests/test_architecture.py)."""

    name: str
    part: str | None = None
    key: str | None = None

    @property
    def source(self) -> str | None:
        return self.key or self.name if self.part else None


RESULT, LOOPS, PROVENANCE = "result", "loops", "provenance"

COLUMNS: list[C] = [
    C("experiment"), C("server_id"), C("cell_id"), C("model"), C("spec_tokens"), C("spec_method"), C("workload"),
    C("context_tokens"), C("concurrency"), C("status"), C("total_tok_s", RESULT, "output_throughput"),
    C("per_request_tok_s", RESULT),
    C("ttft_ms", RESULT, "median_ttft_ms"), C("itl_ms", RESULT, "median_itl_ms"),
    C("tbt_ms", RESULT, "median_tbt_ms"), C("avg_active_requests", RESULT),
    C("completed_requests", RESULT, "completed"), C("output_tokens", RESULT, "total_output_tokens"),
    C("measured_s", RESULT), C("prompt_tok_s", RESULT),
    C("spec_acceptance_rate", RESULT, "spec_decode_acceptance_rate"),
    C("spec_acceptance_length", RESULT, "spec_decode_acceptance_length"), C("prefix_cache_hit_rate", RESULT),
    C("cached_prompt_share", RESULT), C("loop_fraction", LOOPS), C("suspected_fraction", LOOPS),
    C("loop_status_policy", LOOPS, "policy"), C("error", RESULT), C("vllm_version", PROVENANCE),
    C("runtime_ref", PROVENANCE),
    # beyond the contract: what a reader of the matrix needs to trust a number
    C("max_tokens"), C("duration_s"), C("failed_requests", RESULT, "failed"), C("num_requests", RESULT),
    C("p90_ttft_ms", RESULT), C("p99_ttft_ms", RESULT),
    C("p90_tbt_ms", RESULT), C("p99_tbt_ms", RESULT), C("kv_cache_size_tokens", RESULT),
    C("needed_kv_tokens", RESULT),
    C("server_generation_tokens", RESULT), C("preemptions", RESULT),
    C("spec_decode_per_position_acceptance", RESULT), C("server_start_id", PROVENANCE),
    C("started_at", RESULT), C("hostname", PROVENANCE), C("slurm_job_id"),
    C("mean_ttft_ms", RESULT), C("p95_ttft_ms", RESULT), C("corpus"), C("shared_prefix"), C("ignore_eos", RESULT),
    C("server_metrics", RESULT), C("token_count_gap", RESULT),
    C("server_running_mean", RESULT), C("prefix_cache_hits", RESULT), C("prefix_cache_queries", RESULT),
    # loops (docs/decisions/0003): the figure over the requests that did not loop, and trust in acceptance
    C("looped_requests", LOOPS), C("total_tok_s_non_looping", LOOPS, "output_throughput_non_looping"),
    C("spec_acceptance_reliable", LOOPS), C("spec_acceptance_client", LOOPS),
    C("spec_acceptance_before_loop", LOOPS), C("loops_after_natural_end", LOOPS),
    C("prompt_format", RESULT),
    # seed experiments: the sweep a server config belongs to and its point ("path=label; ..."), the API used
    C("sweep"), C("sweep_point"), C("api"),
    # repeats: the main figures are the median of a cell's repeats; their 95 % interval (Student's t
    # for the mean of the repeats) and coefficient of variation; each repeat's figure; why a status
    C("repeats"), *(C(c) for c in SPREAD_COLUMNS), C("total_tok_s_repeats"), C("ttft_ms_repeats"),
    C("status_reason", LOOPS),
    # decode: the steady part of the window (total_tok_s) against the whole window; how the streams came
    C("total_tok_s_window", RESULT, "output_throughput_window"), C("steady_fraction", RESULT), C("delivery"),
    C("delivery_burst_share", RESULT),
    # the losslessness check of the cell's speculative config for its sampling setting (speedmatrix.judge.lossless)
    C("lossless_verdict", LOOPS), C("lossless_setting", LOOPS), C("lossless_reason", LOOPS),
    C("lossless_identical_share", LOOPS),
    C("lossless_share_below_floor", LOOPS), C("lossless_twin_share_below_floor", LOOPS),
    # the client check of every cell (speedmatrix.measure.clientcheck): its event loop's lag, its CPU share, the
    # machine's, and its requests' time inside it
    *(C(c, RESULT) for c in clientcheck.FIGURES),
    # a GPU pool: the pool's GPUs the server held, and the other cells that measured during this one
    C("server_gpus"), C("ran_beside"),
    # decisions: the server's GPUs (tensor x pipeline parallel; 0 on the CPU) and output tok/s per
    # GPU (the whole server's on the CPU); on the Pareto frontier of tok/s per user against it; the cell's
    # first latency target (a search cell's: its own) with the share of requests that met it, whether it holds
    # at its percentile, and the goodput of the requests that met it (every target: decisions.parquet)
    C("gpus"), C("tok_s_per_gpu"), C("tok_s_per_user"), C("on_pareto"), C("slo"), C("slo_met"), C("slo_attainment"),
    C("goodput_rps"),
    C("goodput_tok_s"), C("goodput_tok_s_ci_low"), C("goodput_tok_s_ci_high"),
    # GPU telemetry over the measurement window (NVML; null where absent) and the decode roofline
    *(C(c, RESULT) for c in TELEMETRY_COLUMNS), C("gpu_per_gpu"), C("model_weights_gib", PROVENANCE),
    # energy per useful token: what the server's GPUs drew idle before it started; the window's energy per output
    # token above that; the window's energy over the tokens of the requests that met the first target
    C("gpu_idle_power_w", PROVENANCE), C("gpu_energy_above_idle_per_output_token_j"),
    C("goodput_token_share"), C("gpu_energy_per_goodput_token_j"),
    # each workload kind's own columns (prefix cache: the cold pass; decode: the roofline)
    *(C(c) for name in workloads.names() for c in workloads.get(name).column_names()),
]
MATRIX_COLUMNS = [c.name for c in COLUMNS]
# a matrix made before a rename has these columns under their old names (docs/metrics.md, "History"): before
# 2026-12-07 `itl_ms` was the time between tokens and `median_chunk_itl_ms` the ITL between streamed events
RENAMED = {"itl_ms": "tbt_ms", "p90_itl_ms": "p90_tbt_ms", "p99_itl_ms": "p99_tbt_ms", "itl_ms_ci_low": "tbt_ms_ci_low",
           "itl_ms_ci_high": "tbt_ms_ci_high", "itl_ms_cv": "tbt_ms_cv", "median_chunk_itl_ms": "itl_ms"}


def read_matrix(path: str | Path) -> pd.DataFrame:
    """A run's matrix.parquet under today's column names, whichever version of the code wrote it."""
    matrix = pd.read_parquet(path)
    if "tbt_ms" not in matrix and "itl_ms" in matrix:
        matrix = matrix.rename(columns=RENAMED)
    return matrix
# the columns read as they are, by the part of the cell's JSON they come from: column -> key
FROM = {part: {c.name: c.source for c in COLUMNS if c.part == part} for part in (RESULT, LOOPS, PROVENANCE)}


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
        **{col: res.get(key) for col, key in FROM[RESULT].items()},
        **{col: loops.get(key) for col, key in FROM[LOOPS].items()},
        **{col: prov.get(key) for col, key in FROM[PROVENANCE].items()},
        "server_gpus": ",".join(prov.get("server_gpus") or []) or None,
        "ran_beside": "; ".join(f"{b['server_id']}/{b['cell']}" for b in res.get("beside") or []) or None,
        # decided here from the measured share (a new threshold re-derives it, never re-measures)
        "delivery": stats.delivery_kind(res.get("delivery_burst_share")),
        "slurm_job_id": (prov.get("scheduler") or {}).get("SLURM_JOB_ID"),
        "gpu_per_gpu": json.dumps(res["gpu_per_gpu"]) if res.get("gpu_per_gpu") else None,
        "gpu_energy_above_idle_per_output_token_j": telemetry.above_idle(
            res.get("gpu_energy_per_output_token_j"), res.get("gpu_power_w"), prov.get("gpu_idle_power_w")),
        **kind.matrix_fields(spec, res, prov),
    }


DECISION_COLUMNS = [
    "experiment", "server_id", "cell_id", "workload", "context_tokens", "concurrency", "spec_tokens", "sweep",
    "sweep_point", "status", "slo", "slo_definition", "percentile", "ttft_limit_ms", "tpot_limit_ms",
    "e2e_limit_ms", "judged_requests", "met_requests", "attainment", "slo_met", "p_ttft_ms", "p_tpot_ms",
    "p_e2e_ms", "goodput_rps", "goodput_tok_s", "goodput_tok_s_ci_low", "goodput_tok_s_ci_high",
    "goodput_repeats", "goodput_token_share",
]


def cell_decisions(cell: dict[str, Any], row: dict[str, Any], table: pd.DataFrame,
                   targets: list[slo.Target]) -> list[dict[str, Any]]:
    """Every target the cell's kind is judged on, over its requests (speedmatrix.measure.slo)."""
    kind = workloads.get(cell["cell"]["workload"])
    chosen = kind.slo_targets(cell["cell"], targets)
    if not chosen or not len(table) or row["status"] == Status.OVER_CAPACITY:
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
                                                "goodput_tok_s_ci_high", "goodput_token_share")})
            share = first["goodput_token_share"]
            per_token = row.get("gpu_energy_per_output_token_j")
            if per_token is not None and share:
                row["gpu_energy_per_goodput_token_j"] = per_token / share
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
    reqs = frames.stack(tables)
    reqs.to_parquet(requests_out, index=False)
    if decisions_out is not None:
        pd.DataFrame(decided, columns=DECISION_COLUMNS).to_parquet(decisions_out, index=False)
    return matrix
