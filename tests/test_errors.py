"""One clear error per cause: vLLM's own complaint, the run summary grouped by cause, checks before any job."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from conftest import REPO, one_server_experiment, run_snakemake, wait_no_vllm
from speedmatrix.jobs import preflight, summary
from speedmatrix.plan import experiment
from speedmatrix.serve.broker import complaint

ARGPARSE_LOG = """INFO 12-01 01:02:03 [api_server.py:1] vLLM API server version 0.32.0
usage: api_server.py [-h] [--host HOST]
                     [model_tag]
api_server.py: error: unrecognized arguments: --bogus-flag
"""
EXCEPTION_LOG = """Traceback (most recent call last):
  File "x.py", line 1, in <module>
(EngineCore pid=77) ValueError: max_model_len 99999 is larger than the model's 2048
INFO 12-01 01:02:04 shutting down
"""


# vLLM 0.26.0 on an H200 with a mismatched kernel package: the API process's last word points above
ENGINE_CORE_LOG = """(EngineCore pid=4618) ERROR 12-03 15:30:12 [core.py:1330] EngineCore failed to start.
(EngineCore pid=4618) ERROR 12-03 15:30:12 [core.py:1330] AttributeError: module 'cutlass.cute.core' has no attr
(EngineCore pid=4618) Traceback (most recent call last):
(EngineCore pid=4618) AttributeError: module 'cutlass.cute.core' has no attribute 'ThrMma'
(APIServer pid=4434) Traceback (most recent call last):
(APIServer pid=4434)     raise RuntimeError(
(APIServer pid=4434) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


# vLLM for the CPU 0.32.0, max-model-len above the model's own: pydantic says what on the next line
PYDANTIC_LOG = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
                "  Value error, User-specified max_model_len (100000) is greater than the derived max_model_len "
                "(max_position_embeddings=8192.0 or model_max_length=None in model's config.json). "
                "[type=value_error, input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]\n"
                "    For further information visit https://errors.pydantic.dev/2.14/v/value_error\n")


@pytest.mark.parametrize("log, said", [
    (PYDANTIC_LOG, "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig: User-specified "
                   "max_model_len (100000) is greater than the derived max_model_len (max_position_embeddings=8192.0 "
                   "or model_max_length=None in model's config.json)."),
    (ARGPARSE_LOG, "api_server.py: error: unrecognized arguments: --bogus-flag"),
    (EXCEPTION_LOG, "ValueError: max_model_len 99999 is larger than the model's 2048"),
    (ENGINE_CORE_LOG, "AttributeError: module 'cutlass.cute.core' has no attribute 'ThrMma' "
                      "(RuntimeError: Engine core initialization failed)"),
])
def test_vllms_complaint_is_the_line_that_says_why(tmp_path, log, said):
    path = tmp_path / "server.log"
    path.write_text(log)
    assert complaint(path) == said


def test_the_run_summary_groups_failed_jobs_by_cause(tmp_path):
    res = tmp_path / "results" / "e"
    jobs = []
    for k, state in enumerate(["done", "failed", "failed-again", "failed", "not-run"]):
        log = res / f"logs/cells/s/c{k}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        if state == "failed":
            log.write_text("[01:02:03] starting server s\n[01:02:40] ERROR: server s failed to start: "
                           "vLLM exited with code 2 during start-up: api_server.py: error: unrecognized arguments\n")
        elif state == "failed-again":
            log.write_text("[01:02:41] ERROR: server s failed to start earlier in this run: vLLM exited with code 2 "
                           "during start-up: api_server.py: error: unrecognized arguments\n")
        jobs.append((f"s/c{k}", {"done": summary.DONE, "not-run": summary.NOT_RUN}.get(state, summary.FAILED), log))
    s = summary.write(res, jobs, succeeded=False)
    assert (s["jobs"], s["done"], s["failed"], s["not_run"]) == (5, 1, 3, 1)
    assert len(s["causes"]) == 1 and s["causes"][0]["jobs"] == ["s/c1", "s/c2", "s/c3"]
    assert "unrecognized arguments" in s["causes"][0]["cause"]
    assert json.loads((res / "run-summary.json").read_text()) == s
    assert "3 failed: server s failed to start" in summary.text(s)


def test_a_failed_run_without_a_failed_job_never_reads_as_0_failed(tmp_path):
    """Snakemake can stop on an error outside every job (its own): the summary says so, not "0 failed"."""
    s = summary.summarize(tmp_path, [("pin_runtime", summary.DONE, None), ("aggregate", summary.NOT_RUN, None)],
                          succeeded=False)
    assert s["failed"] == 0 and not s["succeeded"]
    line = summary.text(s)
    assert "0 failed" not in line and "outside its jobs" in line and "1 of 2 jobs done" in line


def test_jobs_are_named_for_their_rule_and_wildcards():
    assert summary.job_name("decode", {"server_id": "base", "cell_key": "ctx128-c1"}) == "base/decode-ctx128-c1"
    assert summary.job_name("loops", {"server_id": "base", "cell_id": "decode-ctx128-c1"}) == \
        "loops base/decode-ctx128-c1"
    assert summary.job_name("reference", {"server_id": "b", "cell_id": "capacity-ctx128-c1"}) == \
        "reference b/capacity-ctx128-c1"
    assert summary.job_name("gate", {"server_id": "base", "gate": "smoke"}) == "base gate smoke"
    assert summary.job_name("p2p_check", {"server_id": "tp2"}) == "tp2 p2p_check"
    assert summary.job_name("model", {"model": "tiny-gemma4"}) == "model tiny-gemma4"
    assert summary.job_name("report", {}) == "report"


def test_preflight_names_a_missing_runtime_command(tmp_path):
    d = tmp_path / "experiments"
    d.mkdir()
    data = yaml.safe_load((REPO / "config/experiments/tiny-cpu.yaml").read_text())
    data["runtime"]["command"] = [str(tmp_path / "no-venv/bin/vllm"), "serve"]
    (d / "cmd.yaml").write_text(yaml.safe_dump(data))
    problems = preflight.problems(experiment.load("cmd", d))
    assert len(problems) == 1 and "runtime.command" in problems[0] and "no-venv/bin/vllm does not exist" in problems[0]
    assert preflight.problems(experiment.load("tiny-cpu", REPO / "config/experiments")) == []


def test_a_missing_api_key_is_generated_for_the_run_and_not_shown(monkeypatch):
    # set, then removed, through monkeypatch: the key generated below is taken away after the test (a key left in
    # this process's environment reached every later test's clients)
    monkeypatch.setenv("SPEEDMATRIX_API_KEY", "")
    monkeypatch.delenv("SPEEDMATRIX_API_KEY")
    exp = experiment.load("seed002-gemma4-26b-a4b-nvfp4-speed-matrix-tiny", REPO / "config/experiments")
    assert preflight.api_keys(exp) == ["SPEEDMATRIX_API_KEY"]
    assert len(os.environ["SPEEDMATRIX_API_KEY"]) >= 24
    assert preflight.api_keys(exp) == []  # set now: kept as it is


def two_cell_experiment_with(tmp_path, name: str, flag: str, value) -> Path:
    """One server config with two decode cells and one vLLM flag set: the experiments dir."""
    exp_dir = one_server_experiment(tmp_path, name, {
        "decode": {"contexts": [128], "concurrency": [1, 2], "duration_s": 2, "max_tokens": 16}})
    path = exp_dir / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    data["server"]["args"][flag] = value
    path.write_text(yaml.safe_dump(data))
    return exp_dir


def test_an_unknown_vllm_flag_is_refused_before_any_job_with_vllms_words(tmp_path):
    """The run's first step checks every server config with the vLLM that serves it: nothing runs, and the message
    names the file, the config, the key and vLLM's own words, without a traceback of ours."""
    exp_dir = two_cell_experiment_with(tmp_path, "bogus", "bogus-flag", 1)
    proc = run_snakemake(tmp_path, experiment="bogus", experiments_dir=exp_dir, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "before any job" in out and "bogus.yaml: server config 'base', key 'args.bogus-flag'" in out
    assert "unrecognized arguments: --bogus-flag" in out
    assert not (tmp_path / "results").exists()  # no pin, no model, no server
    assert "src/speedmatrix/" not in out  # no traceback through our code


@pytest.mark.engine
def test_a_server_that_fails_to_start_fails_once_per_config_with_vllms_words(tmp_path):
    """What only a start finds: max-model-len above the model's own limit, where the model is not yet at hand when
    the run checks it (a first run: the model job makes it). The server fails once; both cells fail on that cause
    with vLLM's words, the rest is counted as not run."""
    exp_dir = two_cell_experiment_with(tmp_path, "toolong", "max-model-len", 100000)
    proc = run_snakemake(tmp_path, experiment="toolong", experiments_dir=exp_dir, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert wait_no_vllm(30) == []
    s = json.loads(Path(tmp_path / "results/toolong/run-summary.json").read_text())
    # every job of the run is counted: done before the server (pin, two models, models.lock, datasets.lock, the
    # launch spec), the two cells failed on the one cause, their loop verdicts, the aggregation and the report not run
    assert (s["jobs"], s["done"], s["failed"], s["not_run"]) == (12, 6, 2, 4) and len(s["causes"]) == 1
    assert sorted(s["not_run_jobs"])[:2] == ["aggregate", "loops base/decode-ctx128-c1"]
    assert "server base failed to start" in s["causes"][0]["cause"]
    assert "User-specified max_model_len (100000) is greater" in s["causes"][0]["cause"]
    # vLLM's words reach the user without a Python traceback of ours
    assert "User-specified max_model_len (100000)" in out
    assert "src/speedmatrix/" not in out  # no traceback through our code
    logs = list((tmp_path / "results/toolong/logs/cells/base").glob("*.log"))
    assert len(logs) == 2 and all("Traceback" not in p.read_text() for p in logs)
    # a second check, now that the model is at hand, refuses it before any job
    again = run_snakemake(tmp_path, experiment="toolong", experiments_dir=exp_dir, timeout=600)
    assert again.returncode != 0 and "above the model's own limit 8,192" in again.stdout + again.stderr


def test_a_model_missing_offline_fails_in_the_summary_with_one_error_line(tmp_path):
    """A job other than a cell fails (a Hub model not in the cache, downloads off): the run summary counts it as
    failed with its cause, the rest as not run (never "0 failed"), and the model's log ends in one ERROR: line,
    without a traceback. No server starts."""
    exp_dir = one_server_experiment(tmp_path, "offline", {
        "latency": {"contexts": [128], "requests": 1, "max_tokens": 4}})
    path = exp_dir / "offline.yaml"
    data = yaml.safe_load(path.read_text())
    data["models"]["tiny-gemma4-trained"] = {"repo": "speedmatrix-test/not-cached", "revision": "main"}
    path.write_text(yaml.safe_dump(data))
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-empty")}
    old = dict(os.environ)
    os.environ.update(env)
    try:
        proc = run_snakemake(tmp_path, experiment="offline", experiments_dir=exp_dir, timeout=600)
    finally:
        os.environ.clear()
        os.environ.update(old)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    res = tmp_path / "results/offline"
    s = json.loads((res / "run-summary.json").read_text())
    assert s["failed"] == 1 and s["causes"][0]["jobs"] == ["model tiny-gemma4-trained"], s
    assert "not in the Hugging Face cache" in s["causes"][0]["cause"]
    assert s["done"] + s["failed"] + s["not_run"] == s["jobs"] and "base/latency-ctx128" in s["not_run_jobs"]
    assert "1 failed" in out and "0 failed" not in out
    log = (res / "logs/models/tiny-gemma4-trained.log").read_text()
    assert "Traceback" not in log and log.count("ERROR: ") == 1
    assert not (res / "servers/base/startup.json").exists()
