"""The seeds' experiments: their server commands, flag for flag, and the -tiny variants' shape."""

from __future__ import annotations

import io
import json
import os
import shlex
from contextlib import redirect_stdout

import pytest

from conftest import REPO
from speedmatrix import cli
from speedmatrix.plan import experiment

SEEDS = ["seed000-gemma4-31b-nvfp4-mtp-tp2", "seed002-gemma4-26b-a4b-nvfp4-speed-matrix",
         "seed003-gemma4-capacity-c128"]


def argv_lines(name: str) -> dict[str, list[str]]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert cli.main(["argv", name, "--experiments-dir", str(REPO / "config/experiments"),
                         "--results-dir", "/nonexistent"]) == 0
    out = {}
    for line in buf.getvalue().splitlines():
        sid, _, argv = line.partition("\t")
        out[sid] = json.loads(argv)
    return out


def seed_command(name: str) -> list[str]:
    text = (REPO / "tests/data/seeds" / name).read_text()
    return shlex.split(text.replace("\\\n", " ").replace("$HOME", os.path.expanduser("~")))


def without_lifecycle_options(argv: list[str]) -> list[str]:
    """The argv less what the pipeline adds to every container it runs (docs/containers.md): --init (SIGTERM
    reaches vLLM), --rm, and the labels that say whose container it is."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--label":
            skip = True
        elif a not in ("--init", "--rm"):
            out.append(a)
    return out


def test_seed000_optimized_command_flag_for_flag():
    seed = seed_command("000-optimized-run-command.sh")
    # the shell expands ~ in the volume; the argv holds the expanded path
    seed = [os.path.expanduser(a) if a.startswith("~") else a for a in seed]
    ours = argv_lines(SEEDS[0])["optimized"]
    assert ours[:4] == ["docker", "run", "--init", "--rm"]
    assert ours[ours.index("--label") + 1] == "speedmatrix.experiment=seed000-gemma4-31b-nvfp4-mtp-tp2"
    assert without_lifecycle_options(ours) == seed


def _flags(argv: list[str]) -> list[tuple[str, object]]:
    """(flag, value) pairs after the model, JSON values parsed: order-free comparison."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and (i + 1 == len(argv) or argv[i + 1].startswith("--")):
            out.append((a, True))
            i += 1
            continue
        value = argv[i + 1]
        try:
            value = json.loads(value) if value.startswith("{") else value
        except ValueError:
            pass
        out.append((a, json.dumps(value, sort_keys=True) if isinstance(value, dict) else value))
        i += 2
    return sorted(out, key=str)


def test_seed002_launch_command_flag_for_flag():
    seed = seed_command("002-launch-command.sh")
    ours = argv_lines(SEEDS[1])["main"]
    model_at = seed.index("RedHatAI/gemma-4-26B-A4B-it-NVFP4")
    assert ours[:model_at + 1] == seed[:model_at + 1]  # env assignments, the venv's vllm serve, the model
    assert _flags(ours[model_at + 1:]) == _flags(seed[model_at + 1:])  # --api-key <redacted> on both sides


def test_seed000_sweeps_expand_to_the_seed_suites():
    exp = experiment.load(SEEDS[0], REPO / "config/experiments")
    by_sweep = {}
    for s in exp.servers:
        by_sweep.setdefault(s.sweep, []).append(s)
    assert [s.spec_tokens for s in by_sweep["spec"]] == [1, 2, 3, 4, 8]
    assert all(s.args["max-num-seqs"] == 16 for s in by_sweep["spec"])
    assert [s.args["max-num-seqs"] for s in by_sweep["max-num-seqs"]] == [16, 32, 64]
    assert all(s.spec_tokens == 4 for s in by_sweep["max-num-seqs"])
    assert [s.args["max-num-batched-tokens"] for s in by_sweep["batched-tokens"]] == [8192, 16384, 32768, 65536]
    assert {c.context_tokens for c in exp.cells("batched-tokens-8192")} == {512, 2048, 8192}
    opt = {c.id for c in exp.cells("optimized")}
    assert {"prefix_cache-ctx4096-c4-share87.5", "prefix_cache-ctx4096-c4-share25"} <= opt
    assert any(i.endswith("-code") for i in opt)  # the coding suite
    assert all(s.gpus == 2 for s in exp.servers)  # tensor parallel 2


def test_sweep_points_that_repeat_a_config_are_measured_right_after_it():
    """The seed's `max-num-seqs-32` is its `optimized` config and `max-num-seqs-16` its `spec-4`: each comes right
    after its own kind, so that one server start serves both (speedmatrix.serve.runtimes.same_launch)."""
    exp = experiment.load(SEEDS[0], REPO / "config/experiments")
    order = exp.server_order()
    assert order[:2] == ["optimized", "max-num-seqs-32"]
    assert order[order.index("spec-4") + 1] == "max-num-seqs-16"
    assert sorted(order) == sorted(s.id for s in exp.servers)
    assert exp.server("spec-4").launch_key == exp.server("max-num-seqs-16").launch_key
    assert exp.server("spec-4").launch_key != exp.server("spec-8").launch_key


def test_same_launch_is_the_launch_less_its_names():
    from speedmatrix.serve.runtimes import same_launch

    a = {"server_id": "spec-4", "sweep": "spec", "sweep_values": {"x": 4}, "argv": ["vllm", "serve", "m"],
         "models": {"m": {"revision": "r1"}}, "host": "127.0.0.1", "port": 0, "env": {}}
    assert same_launch(a, {**a, "server_id": "max-num-seqs-16", "sweep": "max-num-seqs", "sweep_values": {}})
    assert not same_launch(a, {**a, "argv": ["vllm", "serve", "m", "--max-num-seqs", "32"]})
    assert not same_launch(a, {**a, "models": {"m": {"revision": "r2"}}})


def test_seed003_models_by_runner():
    exp = experiment.load(SEEDS[2], REPO / "config/experiments")
    pairs = {(s.model, s.env["VLLM_USE_V2_MODEL_RUNNER"]) for s in exp.servers}
    assert len(pairs) == 8 and {r for _, r in pairs} == {"0", "1"}
    cells = exp.cells(exp.servers[0].id)
    assert {(c.context_tokens, c.concurrency) for c in cells} == {(x, y) for x in (1024, 8192, 30720)
                                                                  for y in (1, 8, 128)}
    assert all(c.requests == 128 and c.max_tokens == 128 for c in cells)
    assert exp.client.api == "chat" and exp.client.chat_template_kwargs == {"enable_thinking": False}
    assert exp.servers[0].args["kv-cache-dtype"] == "fp8"
    assert set(exp.raw["gates"]) == {"smoke", "structured_json", "tool_calls"}
    assert exp.raw["gates"]["tool_calls"]["count"] == 20


@pytest.mark.parametrize("name", SEEDS)
def test_tiny_variant_has_the_same_dag_shape(name):
    full = experiment.load(name, REPO / "config/experiments")
    tiny = experiment.load(f"{name}-tiny", REPO / "config/experiments")
    assert tiny.runtime["kind"] == "local" and tiny.runtime["device"] == "cpu"
    assert [s["id"] for s in tiny.sweeps] == [s["id"] for s in full.sweeps]
    assert [list(s["vary"]) for s in tiny.sweeps] == [list(s["vary"]) for s in full.sweeps]
    assert [s.id for s in tiny.servers if s.sweep is None] == [s.id for s in full.servers if s.sweep is None]
    kinds = lambda e: {(s.sweep, c.workload, c.corpus, c.shared_prefix is not None)  # noqa: E731
                       for s in e.servers for c in e.cells(s.id)}
    assert kinds(tiny) == kinds(full)
    assert set(tiny.raw.get("gates", {})) == set(full.raw.get("gates", {}))
    assert tiny.client.api == full.client.api
    assert [t.name for t in tiny.targets] == [t.name for t in full.targets]  # the targets the seed cared about
    for s in tiny.servers:  # each -tiny model is synthesized here: nothing to download
        assert "synthesize" in tiny.models[s.model]
