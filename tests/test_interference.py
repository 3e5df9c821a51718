"""`speedmatrix interference` on constructed runs whose answer is known (nothing real is timed)."""

from __future__ import annotations

import json

import pandas as pd

from speedmatrix import cli
from speedmatrix.report import interference


def run(tmp_path, name, tok_s, beside=None, gpus=None):
    d = tmp_path / name
    (d / "logs").mkdir(parents=True)
    (d / "logs" / "pin_runtime.log").write_text("[10:00:00] x\n[10:01:40] y\n")
    pd.DataFrame({"server_id": ["a", "b"], "cell_id": ["decode-c1", "decode-c1"], "total_tok_s": tok_s,
                  "ttft_ms": [100.0, 100.0], "tbt_ms": [10.0, 10.0], "prompt_tok_s": [None, None],
                  "ran_beside": beside or [None, None], "server_gpus": gpus or [None, None]}
                 ).to_parquet(d / "matrix.parquet")
    return d


def test_each_cell_beside_against_alone_and_against_a_second_lone_run(tmp_path):
    alone = run(tmp_path, "alone", [100.0, 200.0])
    beside = run(tmp_path, "beside", [99.0, 210.0], beside=["b/decode-c1", "a/decode-c1"], gpus=["1", "0"])
    again = run(tmp_path, "again", [101.0, 200.0])
    got = interference.compare(alone, beside, again)
    a, b = got["cells"]
    assert round(a["total_tok_s_delta_pct"], 6) == -1.0 and round(b["total_tok_s_delta_pct"], 6) == 5.0
    assert round(a["total_tok_s_again_delta_pct"], 6) == 1.0 and b["total_tok_s_again_delta_pct"] == 0.0
    assert a["ttft_ms_delta_pct"] == 0.0 and a["prompt_tok_s_delta_pct"] is None
    assert a["ran_beside"] == "b/decode-c1" and a["server_gpus"] == "1"
    assert got["runs"]["beside"]["wall_s"] == 100
    text = interference.markdown(got)
    assert "| a | 1 | decode-c1 | b/decode-c1 | 100.0 → 99.0 (-1.0 %, +1.0 %)" in text
    cli.main(["interference", str(alone), str(beside), "--out", str(tmp_path / "out")])
    assert json.loads((tmp_path / "out" / "interference.json").read_text())["cells"][1]["server_id"] == "b"
