"""The report's GPU sections (telemetry, roofline, run-to-run spread, agreement) from a matrix that has them."""

from __future__ import annotations

import pandas as pd

from speedmatrix.jobs.aggregate import MATRIX_COLUMNS
from speedmatrix.report import document as report


def row(**kw):
    base = {c: None for c in MATRIX_COLUMNS}
    base.update(server_id="tp1", workload="decode", context_tokens=1024, concurrency=1, status="valid",
                corpus="prose", repeats=1, spec_tokens=0, total_tok_s=55.0, ttft_ms=40.0, tbt_ms=17.7,
                num_requests=1, loop_fraction=0.0, looped_requests=0)
    base.update(kw)
    if base["cell_id"] is None:
        base["cell_id"] = f"{base['workload']}-ctx{base['context_tokens']}-c{base['concurrency']}"
    return base


def test_gpu_sections():
    m = pd.DataFrame([
        row(gpu_name="NVIDIA H200", gpu_power_w=420.0, gpu_energy_per_output_token_j=7.6, gpu_sm_util_pct=98.0,
            gpu_mem_util_pct=60.0, gpu_sm_clock_mhz=1980.0, gpu_mem_clock_mhz=3201.0, gpu_pcie_rx_mb_s=12.0,
            gpu_pcie_tx_mb_s=3.0, gpu_temp_c_max=51.0, model_weights_gib=56.6, roofline_bound_ms=12.66,
            roofline_peak_bw_tb_s=4.8, roofline_pct=71.5),
        row(concurrency=8, corpus="code", repeats=2, total_tok_s=420.0, total_tok_s_repeats=[400.0, 440.0],
            total_tok_s_ci_low=165.9, total_tok_s_ci_high=674.1, total_tok_s_cv=0.0673,
            ttft_ms_repeats=[40.0, 40.0], cell_id="decode-ctx1024-c8-code"),
        row(concurrency=8, total_tok_s=410.0),
    ])
    ref = {"server_id": "tp1", "rounds": 2, "cell": {"cell_id": "capacity-ctx1024-c16"},
           "medians": {"speedmatrix": {"output_throughput": 700.0, "median_ttft_ms": 80.0, "median_itl_ms": 21.0},
                       "vllm_bench_serve": {"output_throughput": 690.0, "median_ttft_ms": 85.0, "median_itl_ms": 21.5}},
           "difference_pct": {"output_throughput": 1.45, "median_ttft_ms": -5.88, "median_itl_ms": -2.33}}
    text = report.render(m, [], {}, {}, "h200", references=[ref],
                         models_lock={"models": {"shape": {"source": "synthesize", "preset": "gemma4-31b-shape"}}})
    assert "## GPU telemetry" in text and "| decode | 1K | 1 | 420 | 7.600 | 98 % |" in text
    assert "## Roofline (decode, one request)" in text
    assert "| 1K | 1 | 17.7 ms | 12.66 ms | 56.6 GiB | 4.8 TB/s | 71.5 % |" in text
    assert "## Run-to-run spread" in text
    assert "| tp1 | decode-ctx1024-c8-code | 2 | 400.0, 440.0 | 420.0 | 165.9–674.1 | 6.7% | 40.0 ms, 40.0 ms |" in text
    # a reference JSON of the one-peer shape: its medians kept, the difference now the client's against ours
    assert "## Agreement with other clients" in text and "| tp1 | capacity-ctx1024-c16 | vllm_bench_serve | 0 |" in text
    assert "| 690.0 | -1.4 % | 85.0 ms | +6.2 % |" in text
    assert "random weights" in text and "mean nothing" in text
    # the sustained-decode table shows the prose cell, not the repeated code one
    assert "| 1K | 55.0 | 410.0 |" in text


def test_spec_sweep_keeps_an_unstable_point():
    """The sweep chart's data: every speculative setting of a cell measured at more than one, an Unstable cell
    included (a figure with a wide spread, as the other charts show it); a failed cell is left out."""
    from speedmatrix.report import charts

    m = pd.DataFrame([
        row(server_id="base", spec_tokens=0, status="unstable", total_tok_s=2878.0),
        row(server_id="mtp2", spec_tokens=2, total_tok_s=1988.0, spec_acceptance_rate=0.135),
        row(server_id="mtp4", spec_tokens=4, total_tok_s=2128.0, spec_acceptance_rate=0.082),
        row(server_id="mtp3", spec_tokens=3, status="failed", total_tok_s=None),
        row(server_id="base", spec_tokens=0, concurrency=16, cell_id="decode-ctx1024-c16-alone"),
    ])
    d = charts.spec_data(m)
    assert sorted(d["spec_tokens"]) == [0, 2, 4]
    assert set(d["cell_id"]) == {"decode-ctx1024-c1"}


def test_a_trained_model_is_named_as_trained_not_synthesized():
    weights = "trained (speedmatrix.provision.training: its recipe, corpus and loss in training.json)"
    lock = {"models": {"tiny": {"source": "trained", "trained": "tiny-gemma4-trained", "weights": weights,
                                "files": {"config.json": "c9", "model.safetensors": "d9"}}}}
    text = report.render(pd.DataFrame([row()]), [], {}, {}, "cpu", models_lock=lock)
    assert ("model `tiny`: trained (speedmatrix.provision.training: its recipe, corpus and loss in training.json), "
            "2 files") in text
    assert "synthesized `None`" not in text


def test_a_per_request_chart_of_a_gpu_run_is_thinned_not_refused(tmp_path):
    """At a GPU's request rates open-loop cells hold tens of thousands of requests: Altair refuses a chart of more
    than 5,000 rows (the report rule failed on such a run); the chart draws one row in k of them instead, every
    cell keeping its share, and says so under its title."""
    from speedmatrix.report import charts

    m = pd.DataFrame([row(workload="rate", concurrency=0, cell_id=f"rate-ctx128-r{r}-poisson") for r in (64, 512)])
    per_cell = {"rate-ctx128-r64-poisson": 2000, "rate-ctx128-r512-poisson": 10000}
    req = pd.DataFrame([{"server_id": "tp1", "cell_id": c, "scheduled_s": i / 100, "start_s": i / 100 + 0.001,
                         "counted": True, "phase": None} for c, n in per_cell.items() for i in range(n)])
    lag = next(c for c in charts.CHARTS if c.name == "lag")
    d = lag.rows(m, req)
    assert len(d) <= charts.MAX_ROWS and d.attrs["thinned"] == (3, 12000)
    assert d["cell"].value_counts().to_dict() == {"512 req/s poisson, ctx 128": 3333, "64 req/s poisson, ctx 128": 667}
    drawn = lag.save(m, tmp_path / "lag.png", req)
    assert drawn.title.subtitle == "one row in 3 of 12,000 drawn (a page stays small)"
    assert (tmp_path / "lag.png").stat().st_size > 0
    # under the limit nothing is thinned
    small = lag.rows(m, req.groupby("cell_id").head(100))
    assert len(small) == 200 and "thinned" not in small.attrs
