"""Hub models: pinned to a commit, recorded in models.lock, offline from a cache, the token never written."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

TOKEN = "hf_speedmatrixTestSecret0123456789"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO_ID = "speedmatrix-test/tiny-model"


def build_cache(root):
    """A Hugging Face cache as huggingface_hub lays it out: blobs named by hash, a snapshot per
    commit linking to them, refs/main naming the commit."""
    repo = root / "hub" / f"models--{REPO_ID.replace('/', '--')}"
    files = {"config.json": json.dumps({"model_type": "gemma4_text"}).encode(),
             "tokenizer_config.json": json.dumps({"eos_token": "<eos>"}).encode(),
             "model.safetensors": b"\0" * 4096}
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    for name, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / digest).write_bytes(data)
        (snap / name).symlink_to(f"../../blobs/{digest}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}


def prepare(tmp_path, revision, hub_home):
    """The model stage in its own process (huggingface_hub reads its settings at import)."""
    env = {**os.environ, "HF_HOME": str(hub_home), "HF_HUB_OFFLINE": "1", "HF_TOKEN": TOKEN,
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    code = ("import json, sys; from speedmatrix.provision import models\n"
            "try:\n"
            f"    m = models.prepare('tiny', {{'repo': {REPO_ID!r}, 'revision': {revision!r}}}, "
            f"{str(tmp_path / 'out')!r})\n"
            "    lock = models.lock({'tiny': m})\n"
            f"    open({str(tmp_path / 'models.lock')!r}, 'w').write(json.dumps(lock))\n"
            "    print(json.dumps(m))\n"
            "except models.ModelError as exc:\n"
            "    print(exc, file=sys.stderr); sys.exit(3)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          cwd=REPO)


@pytest.mark.parametrize("revision", ["main", COMMIT])
def test_offline_from_a_populated_cache_pins_the_commit(tmp_path, revision):
    hashes = build_cache(tmp_path)
    proc = prepare(tmp_path, revision, tmp_path)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads(proc.stdout)
    assert manifest["revision"] == COMMIT and manifest["revision_requested"] == revision
    assert manifest["pinned"] == (revision == COMMIT)
    assert {n: f["blob"] for n, f in manifest["files"].items()} == hashes
    lock = json.loads((tmp_path / "models.lock").read_text())
    assert lock["models"]["tiny"]["revision"] == COMMIT and lock["models"]["tiny"]["repo"] == REPO_ID
    for path in [tmp_path / "models.lock", tmp_path / "out" / "speedmatrix-model.json"]:
        assert TOKEN not in path.read_text()
    assert TOKEN not in proc.stdout + proc.stderr


def test_offline_without_the_model_fails_clearly_without_the_token(tmp_path):
    (tmp_path / "hub").mkdir()
    proc = prepare(tmp_path, COMMIT, tmp_path)
    assert proc.returncode == 3
    assert "model 'tiny'" in proc.stderr and REPO_ID in proc.stderr
    assert "not in the Hugging Face cache" in proc.stderr and "HF_HUB_OFFLINE=1" in proc.stderr
    assert TOKEN not in proc.stdout + proc.stderr
    assert not (tmp_path / "out" / "speedmatrix-model.json").exists()


def test_launch_uses_the_pinned_revision(tmp_path):
    """A downloaded model's server argv carries the commit; `speedmatrix argv` shows it once the manifest exists."""
    import yaml

    from speedmatrix.plan import experiment
    from speedmatrix.serve import runtimes

    data = yaml.safe_load((REPO / "config/experiments/seed000-gemma4-31b-nvfp4-mtp-tp2.yaml").read_text())
    d = tmp_path / "exp"
    d.mkdir()
    (d / "s.yaml").write_text(yaml.safe_dump(data))
    exp = experiment.load("s", d)
    models_dir = tmp_path / "models"
    for name in exp.models:
        (models_dir / name).mkdir(parents=True)
        (models_dir / name / "speedmatrix-model.json").write_text(json.dumps(
            {"source": "huggingface", "repo": exp.models[name]["repo"], "revision": COMMIT, "files": {}}))
    spec = runtimes.launch_spec(exp, "optimized", models_dir, {"image_ref": "vllm/vllm-openai@sha256:" + "a" * 64})
    argv = spec["argv"]
    assert argv[argv.index("--revision") + 1] == COMMIT
    assert json.loads(argv[argv.index("--speculative-config") + 1])["revision"] == COMMIT
    assert "vllm/vllm-openai@sha256:" + "a" * 64 in argv and "vllm/vllm-openai:cu129-nightly" not in argv
    assert spec["stop_argv"] == ["docker", "rm", "--force", "gemma4-31b-it"]
    # a GPU experiment's server keeps its priority; on the CPU it gives way to the client (runtime.server_nice)
    assert spec["nice"] == 0
    cpu = experiment.load("tiny-cpu", REPO / "config/experiments")
    assert runtimes.server_nice(cpu) == 10
    data = yaml.safe_load((REPO / "config/experiments/tiny-cpu.yaml").read_text())
    data["runtime"]["server_nice"] = 0
    (d / "c.yaml").write_text(yaml.safe_dump(data))
    assert runtimes.server_nice(experiment.load("c", d)) == 0
