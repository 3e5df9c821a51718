"""The independent clients of the reference rule: what each is asked, how its output is read, how the
agreement is summarized. Engine-free: the outputs are small recorded shapes of each client's own files."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, one_server_experiment, snakemake_cmd, wait_no_vllm
from speedmatrix import peers
from speedmatrix.report import sections

LOAD = peers.Load(url="http://127.0.0.1:9", model="m", tokenizer="/tok", context=1024, max_tokens=256,
                  requests=64, concurrency=16, seed=7)


def need_peers():
    """AIPerf and GuideLLM in .peers/ (`make peers`): a skip without them, a failure in CI."""
    missing = [n for n in ("aiperf", "guidellm") if not (REPO / ".peers" / n / ".installed").exists()]
    if missing:
        if os.environ.get("SPEEDMATRIX_CI"):
            pytest.fail(f"{', '.join(missing)} not installed: .ci/run runs `make peers` first")
        pytest.skip("`make peers` installs AIPerf and GuideLLM")


def test_every_client_is_asked_the_same_load(tmp_path):
    table = peers.table()
    assert set(table) == {"vllm_bench_serve", "aiperf", "guidellm"}
    vb = table["vllm_bench_serve"].argv(["py"], LOAD, tmp_path, None)
    assert ["--random-input-len", "1024"] == vb[vb.index("--random-input-len"):][:2]
    assert "--ignore-eos" in vb and ["--temperature", "0"] == vb[vb.index("--temperature"):][:2]
    ap = table["aiperf"].argv(["py"], LOAD, tmp_path, "sekret")
    # greedy and EOS ignored as extra inputs; tokens counted from the server's usage, not re-tokenized
    assert "temperature:0" in ap and "ignore_eos:true" in ap and "--use-server-token-count" in ap
    # special tokens streamed as text, by every client (a model may emit nothing else)
    assert "skip_special_tokens:false" in ap and json.loads(vb[vb.index("--extra-body") + 1]) == LOAD.body
    assert ["--concurrency", "16"] == ap[ap.index("--concurrency"):][:2] and ap[-1] == "--api-key=sekret"
    # a key that starts with "-" (a generated key may) stays the option's value
    assert table["aiperf"].argv(["py"], LOAD, tmp_path, "-k3y")[-1] == "--api-key=-k3y"
    gl = table["guidellm"].argv(["py"], LOAD, tmp_path, "sekret")
    scenario = json.loads(Path(gl[gl.index("--scenario") + 1]).read_text())["spec"]
    assert scenario["backend"]["extras"] == {"body": LOAD.body}
    assert scenario["data"] == [{"kind": "synthetic_text", "prompt_tokens": 1024, "output_tokens": 256}]
    # a sampled cell: every client asks for its temperature, top_p and seed
    sampled = dataclasses.replace(LOAD, sampling={"temperature": 0.7, "top_p": 0.9, "seed": 5})
    vb = table["vllm_bench_serve"].argv(["py"], sampled, tmp_path, None)
    assert ["--temperature", "0.7"] == vb[vb.index("--temperature"):][:2]
    assert json.loads(vb[vb.index("--extra-body") + 1]) == {**LOAD.body, "temperature": 0.7, "top_p": 0.9, "seed": 5}
    ap = table["aiperf"].argv(["py"], sampled, tmp_path, None)
    assert "temperature:0.7" in ap and "top_p:0.9" in ap and "seed:5" in ap
    assert scenario["profile"] == {"kind": "concurrent", "streams": 16}
    assert scenario["constraints"] == [{"kind": "max_requests", "count": 64}]
    assert (tmp_path / "scenario.json").stat().st_mode & 0o077 == 0  # the key's file is private


def test_each_clients_output_is_read_into_the_shared_fields(tmp_path):
    art = tmp_path / "artifacts" / "x"
    art.mkdir(parents=True)
    (art / "profile_export_aiperf.json").write_text(json.dumps({
        "request_count": {"avg": 64}, "total_output_tokens": {"avg": 16384},
        "output_token_throughput": {"avg": 600.5}, "time_to_first_token": {"p50": 950.0, "avg": 960.0},
        "inter_token_latency": {"p50": 23.0}, "benchmark_duration": {"avg": 27.3}}))
    got = peers.table()["aiperf"].parse(tmp_path)
    assert got["output_throughput"] == 600.5 and got["median_tpot_ms"] == 23.0 and got["completed"] == 64
    (tmp_path / "guidellm.json").write_text(json.dumps({"benchmarks": [{"duration": 20.0, "metrics": {
        "request_totals": {"successful": 64},
        "output_token_count": {"successful": {"total_sum": 16384, "count": 64}},
        "time_to_first_token_ms": {"successful": {"median": 940.0, "mean": 950.0, "count": 64}},
        "inter_token_latency_ms": {"successful": {"median": 22.9, "count": 64}}}}]}))
    got = peers.table()["guidellm"].parse(tmp_path)
    assert got["output_throughput"] == 16384 / 20.0 and got["median_ttft_ms"] == 940.0


def test_agreement_summary_and_a_failed_client_in_the_report():
    runs = {"speedmatrix": [{"output_throughput": 600.0, "median_ttft_ms": 950.0, "median_tpot_ms": 23.0},
                            {"output_throughput": 602.0, "median_ttft_ms": 960.0, "median_tpot_ms": 23.0}],
            "vllm_bench_serve": [{"output_throughput": 606.0, "median_ttft_ms": 940.0, "median_tpot_ms": 23.0}],
            "aiperf": [{"error": "aiperf failed (1): Failed to load tokenizer", "client_cpu_s": None}]}
    s = peers.summarize(runs)
    assert s["medians"]["speedmatrix"]["output_throughput"] == 601.0
    assert s["spread"]["speedmatrix"]["output_throughput"] == [600.0, 602.0]
    assert s["difference_pct"]["vllm_bench_serve"]["output_throughput"] == round(100 * (606 / 601 - 1), 2)
    assert s["difference_pct"]["aiperf"]["output_throughput"] is None
    doc = {"server_id": "tp1", "cell": {"cell_id": "capacity-ctx1024-c16"}, "clients": list(runs), "runs": runs,
           **s, "notes": {}, "failed": {"aiperf": runs["aiperf"][0]["error"]}}
    text = "\n".join(" | ".join(row) for row in sections.reference_table([doc]).rows)
    assert "aiperf | 0 (+1 failed)" in text and "+0.8 %" in text
    assert sections.reference_notes([doc]) == ["aiperf failed: aiperf failed (1): Failed to load tokenizer"]


def test_a_round_short_of_its_requests_is_kept_but_not_compared():
    """A client round that ended after 4 of the 8 requests asked (seen once from GuideLLM on the CPU server)
    measured another load: its figures stay in the document, out of the medians, and the round counts failed."""
    from speedmatrix.jobs.reference import short_round

    whole = {"completed": 8, "output_throughput": 300.0, "median_ttft_ms": 50.0}
    short = {"completed": 4, "output_throughput": 900.0, "median_ttft_ms": 20.0}
    assert short_round(whole, 8) is None and short_round({"completed": None}, 8) is None
    reason = short_round(short, 8)
    assert reason == "completed 4 of the 8 requests asked: kept in the document, left out of the agreement"
    runs = {"speedmatrix": [dict(whole)], "guidellm": [dict(whole), {**short, "error": reason}]}
    s = peers.summarize(runs)
    assert s["medians"]["guidellm"]["output_throughput"] == 300.0
    assert s["spread"]["guidellm"]["median_ttft_ms"] == [50.0, 50.0]
    assert s["difference_pct"]["guidellm"]["output_throughput"] == 0.0
    doc = {"server_id": "tp1", "cell": {"cell_id": "capacity-ctx256-c4"}, "clients": list(runs), "runs": runs,
           **s, "notes": {}, "failed": {"guidellm": reason}}
    text = "\n".join(" | ".join(row) for row in sections.reference_table([doc]).rows)
    assert "guidellm | 1 (+1 failed)" in text
    assert sections.reference_notes([doc]) == [f"guidellm failed: {reason}"]


def test_a_client_that_cannot_run_is_refused_with_the_key_and_what_to_do(tmp_path):
    found = peers.problems(["nosuch", "aiperf"], {"python": {"aiperf": str(tmp_path / "none" / "python")}}, "X.yaml")
    assert found[0].startswith("X.yaml: key 'reference.clients': unknown client 'nosuch'")
    assert "aiperf cannot be imported" in found[1] and "make peers" in found[1]
    assert peers.problems(["vllm_bench_serve"], {"python": {"vllm_bench_serve": sys.executable}}, "X.yaml") == []


def test_aiperf_runs_online_for_a_local_tokenizer_folder(tmp_path):
    # AIPerf 0.13.0 offline looks a local folder up in the hub cache and fails (seen on the H200)
    environ = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/bin"}
    aiperf = peers.table()["aiperf"]
    local = LOAD.__class__(**{**LOAD.__dict__, "tokenizer": str(tmp_path)})
    assert aiperf.env(environ, local, None) == {"PATH": "/bin"}
    assert aiperf.env(environ, LOAD, None) == environ  # a hub name: left as the user set it
    assert peers.table()["vllm_bench_serve"].env({}, LOAD, "k") == {"OPENAI_API_KEY": "k"}


@pytest.mark.engine
@pytest.mark.peers
def test_reference_rule_with_three_other_clients_on_the_real_server(tmp_path):
    """The reference rule on the CPU vLLM: speedmatrix, vllm bench serve, AIPerf and GuideLLM each measure the
    same cell on the same server, the agreement lands in the JSON and the report. Run offline
    (HF_HUB_OFFLINE=1), as on the H200, where AIPerf then failed to load a local tokenizer folder."""
    need_peers()
    # repeats: 2 for the matrix's cell; a reference round measures it once, as the other clients do
    d = one_server_experiment(tmp_path, "peers", {"capacity": {"contexts": [128], "concurrency": [4],
                                                               "requests": 8, "max_tokens": 16, "repeats": 2}})
    exp = yaml.safe_load((d / "peers.yaml").read_text())
    exp["reference"] = {"cells": ["capacity-ctx128-c4"], "rounds": 1,
                        "clients": ["vllm_bench_serve", "aiperf", "guidellm"]}
    (d / "peers.yaml").write_text(yaml.safe_dump(exp))
    proc = subprocess.run(snakemake_cmd(tmp_path, experiment="peers", experiments_dir=d), cwd=REPO,
                          capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "results/peers/reference/base/capacity-ctx128-c4.json").read_text())
    assert doc["clients"] == ["speedmatrix", "vllm_bench_serve", "aiperf", "guidellm"] and not doc["failed"]
    for who in doc["clients"]:
        (row,) = doc["runs"][who]
        # every client finished the 8 requests and counted the server's 16 tokens each
        assert row["completed"] == 8 and row["total_output_tokens"] == 8 * 16, (who, row)
        assert row["output_throughput"] > 0 and row["median_ttft_ms"] > 0 and row["client_cpu_s"] >= 0
    # speedmatrix's round says whether its client kept up: the client check of the cell, and its status
    check = doc["runs"]["speedmatrix"][0]["check"]
    assert check["status"] in ("valid", "client_bound") and 0 <= check["client_cpu_share"]
    assert "client_loop_lag_p95_ms" in check and "machine_busy_share" in check
    report = (tmp_path / "results/peers/report.md").read_text()
    assert "## Agreement with other clients" in report and "| base | capacity-ctx128-c4 | guidellm | 1 |" in report
    assert wait_no_vllm(30) == []


@pytest.fixture
def special_token_server():
    """tests/fault_server.py on a port of its own (the clients are other processes), answering every request
    with special tokens only: empty text unless the request keeps special tokens."""
    import asyncio
    import socket
    import threading

    from aiohttp import web

    import fault_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    application = fault_server.app()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(application)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}", application[fault_server.BODIES]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.run_until_complete(runner.cleanup())


@pytest.mark.peers
def test_clients_that_time_the_first_text_see_a_model_that_emits_only_special_tokens(tmp_path,
                                                                                      special_token_server):
    """On the H200 the 31B shape's random weights emit <pad> after <pad>. Streamed with special tokens skipped,
    every event's text is empty: AIPerf then counted every request failed and GuideLLM reported a TTFT of 0.
    Every client now asks for special tokens as text, as speedmatrix's own client does with ignore_eos."""
    need_peers()
    from speedmatrix.provision import models

    url, bodies = special_token_server
    models.synthesize("tiny-gemma4", tmp_path / "tiny")  # its tokenizer: the clients write their prompts with it
    load = peers.Load(url=url, model="special", tokenizer=str(tmp_path / "tiny"), context=32, max_tokens=8, requests=4,
                      concurrency=2, seed=3)
    for who in ("aiperf", "guidellm"):
        row = peers.run(peers.table()[who], load, peers.python_for(who, {}), tmp_path / who)
        assert row["completed"] == 4 and row["total_output_tokens"] == 32, (who, row)
        assert row["median_ttft_ms"] > 0, (who, row)
    sent = [b for b in bodies if b.get("max_tokens") == 8]
    assert len(sent) >= 8 and all(b["skip_special_tokens"] is False and b["temperature"] == 0 for b in sent)


def test_speedmatrix_round_keeps_whether_its_client_kept_up_and_what_failed():
    """The reference document's speedmatrix round keeps, beside the compared figures, its client check and its
    failures by kind: at a load past the server's saturation a round that lost requests says why, and whether the
    client was the bottleneck."""
    from speedmatrix.jobs import reference

    result = {"completed": 6859, "output_throughput": 8614.6, "status": "client_bound",
              "status_reason": "loop lag p95 60 ms", "errors_by_kind": {"ServerDisconnectedError": 1447},
              "schedule_lag_p95_ms": 310.0, "client_loop_lag_p95_ms": 60.0, "client_cpu_share": 0.5,
              "machine_busy_share": None}
    row = reference._ours(result)
    assert row["completed"] == 6859 and row["output_throughput"] == 8614.6
    assert row["check"]["errors_by_kind"] == {"ServerDisconnectedError": 1447}
    assert row["check"]["status"] == "client_bound" and row["check"]["client_loop_lag_p95_ms"] == 60.0
    assert "machine_busy_share" not in row["check"]  # not measured: left out, not null
