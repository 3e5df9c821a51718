"""Shared helpers: run the workflow in a scratch results dir, find vLLM processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def vllm_processes() -> list[str]:
    """Every live process that belongs to a vLLM server or a speedmatrix broker.

    vLLM's EngineCore and Worker replace their command line with a process
    title (``VLLM::EngineCore``), so both the title and the argv are checked.
    """
    found = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            stat = (d / "stat").read_text()
            if stat.split(")")[-1].split()[0] == "Z":
                continue
            comm = (d / "comm").read_text().strip()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if comm.startswith("VLLM") or "VLLM::" in cmd or "vllm.entrypoints" in cmd or "speedmatrix.serve.broker" in cmd:
            found.append(f"{d.name} {comm} {cmd[:120]}")
    return found


def wait_no_vllm(timeout_s: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    left = vllm_processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = vllm_processes()
    return left


def snakemake_cmd(workdir: Path, *extra: str, experiment: str = "tiny-cpu",
                  experiments_dir: str | Path = "config/experiments") -> list[str]:
    return [
        sys.executable, "-m", "snakemake", "--profile", "profiles/default",
        "--config", f"experiment={experiment}", f"results_dir={workdir / 'results'}",
        f"models_dir={workdir / 'models'}", f"experiments_dir={experiments_dir}",
        *extra,
    ]


def run_snakemake(workdir: Path, *extra: str, timeout: float = 1500, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(snakemake_cmd(workdir, *extra, **kw), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_for(pred, timeout_s, what):
    """``pred()``'s first true value, polled every 0.2 s; fails the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def running_decode_cell(res: Path, finished: int, server_id: str = "base") -> str | None:
    """The decode cell of ``server_id`` now measuring, once ``finished`` of its cells are done."""
    if len(list(res.glob(f"cells/{server_id}/*.json"))) < finished:
        return None
    for log in res.glob(f"logs/cells/{server_id}/*.log"):
        if not (res / "cells" / server_id / f"{log.stem}.json").exists() and "decode:" in log.read_text():
            return log.stem
    return None


# cells long enough to kill something during one
# fixed 8 s windows (a block's own `precision` over the experiment's): the lifecycle tests stop things mid-cell
LIFECYCLE_WORKLOADS = {"decode": {"contexts": [128], "concurrency": [1, 2, 4], "duration_s": 8, "max_tokens": 64,
                                  "precision": {"enabled": False}}}


def starts(results: Path) -> dict[str, int]:
    """Server starts per server config of a results folder (``servers/<id>/starts.jsonl``, a line per start)."""
    return {f.parent.name: len(f.read_text().splitlines()) for f in results.glob("servers/*/starts.jsonl")}


def experiment_variant(work: Path, name: str, base: str, change) -> Path:
    """Write ``<work>/experiments/<name>.yaml``: the experiment ``base`` of config/experiments after
    ``change(data)``, its keys in the order written (a sweep names its configs in the order of its `vary`
    keys). Returns the experiments dir."""
    import yaml

    data = yaml.safe_load((REPO / "config" / "experiments" / f"{base}.yaml").read_text())
    change(data)
    d = work / "experiments"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return d


def one_server_experiment(tmp_path: Path, name: str, workloads: dict, servers: list[dict] | None = None,
                          base: str = "tiny-cpu", runtime: dict | None = None) -> Path:
    """Write ``<tmp>/experiments/<name>.yaml``: ``base`` (tiny-cpu) with only its ``base`` server (or
    ``servers``), these workloads, no quality gates and, if given, changes to its runtime. The servers run without
    torch.compile (``enforce-eager``): these experiments test the lifecycle, not speed
    (docs/decisions/0013-first-run-and-ci-time.md)."""

    def change(data: dict) -> None:
        data["runtime"].update(runtime or {})
        data["servers"] = servers or [{"id": "base"}]
        data.pop("gates", None)  # the default run's test runs them
        data["server"]["args"]["enforce-eager"] = True
        if workloads:
            data["workloads"] = workloads
        else:  # each server config brings its own
            data.pop("workloads", None)

    return experiment_variant(tmp_path, name, base, change)


def lighter(block, window_s: float = 1, max_tokens: int = 16, corners: bool = False):
    """The same cells with less measuring in each: windows of at most ``window_s``, outputs of at most
    ``max_tokens`` tokens, one repeat. ``corners``: of a grid's contexts and concurrencies only the first and
    the last (a 3 x 4 decode grid becomes 2 x 2: its smallest and largest cells, the over-capacity one too)."""
    def inner(b):
        return lighter(b, window_s, max_tokens, corners)

    if isinstance(block, list):
        return [inner(b) for b in block]
    if not isinstance(block, dict):
        return block
    out = {k: inner(v) for k, v in block.items()}
    if "duration_s" in out:
        out["duration_s"] = min(out["duration_s"], window_s)
    if "max_tokens" in out and "contexts" in out:  # a workload block (not a quality gate)
        out["max_tokens"] = min(out["max_tokens"], max_tokens)
        if corners:
            for key in ("contexts", "concurrency"):
                if isinstance(out.get(key), list) and len(out[key]) > 2:
                    out[key] = [out[key][0], out[key][-1]]
    if "repeats" in out:
        out["repeats"] = 1
    return out


def lighter_copy(work: Path, name: str, **kw) -> Path:
    """``<work>/experiments/<name>.yaml``: experiment ``name`` with every server config, sweep point and
    workload, each cell measuring less (``lighter``; with ``corners=True`` a grid keeps only its corner
    cells). For tests that check what a run produces, not how a cell measures (the default run's test checks
    that). Returns the experiments dir."""

    def change(data: dict) -> None:
        for key in ("workloads", "servers", "sweeps"):
            if key in data:
                data[key] = lighter(data[key], **kw)

    return experiment_variant(work, name, name, change)


@pytest.fixture(scope="session")
def no_vllm_before():
    left = vllm_processes()
    if left:
        pytest.fail("vLLM processes are already running before the engine tests; stop them first: "
                    + "; ".join(left))


# --------------------------------------------------------------------------- where the suite's time goes

_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Every phase of every test (set-up, call, tear-down) counted to its file: a module fixture's run is
    the set-up of the first test that asks for it."""
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _FILE_SECONDS:
        return
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_sep("=", "seconds per test file (set-up, call and tear-down)")
    for path, secs in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{secs:9.1f} s  {100 * secs / total:5.1f} %  {path}")
    terminalreporter.write_line(f"{total:9.1f} s  100.0 %  in all")
