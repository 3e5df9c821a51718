"""The broker: the process that starts one vLLM server, watches it, and ends it (and how to find and stop one).

Why a broker (docs/decisions/0001-server-lifecycle.md): every cell is its own
Snakemake job, so no job can own a server that the next cell reuses. The
first cell of a server config starts a small *broker* process
(``python -m speedmatrix.serve.broker``, its spec on stdin), which starts vLLM in a
process group of its own, waits until it serves, writes ``startup.json`` and
``broker.json``, and then watches:

* the vLLM API server: if it dies, the broker ends the whole process group
  (vLLM's EngineCore and Worker survive a dead API server otherwise);
* its owner, the Snakemake main process (``SPEEDMATRIX_OWNER=host:pid``):
  when the workflow ends, however it ends, the server ends within a second;
* an idle timeout: no cell for ``idle_timeout_s`` ends it as a safety net;
* SIGTERM/SIGINT: the workflow's ``onsuccess``/``onerror`` stop it at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import atomic, host
from ..measure import metrics, telemetry
from . import runtimes, state
from .procs import POLL_S, end_group, group_alive, http_get, http_post_json, owner_alive, pid_alive


@dataclass
class BrokerArgs:
    state_dir: Path
    argv: list[str]
    env: dict[str, str]
    url: str
    startup_timeout_s: float
    idle_timeout_s: float
    owner: str | None
    server_id: str
    experiment: str
    token: str = ""
    stop_argv: list[str] | None = None
    gpus: list[str] | None = None  # the pool's GPUs this server holds for its life (None: the whole device)
    nice: int = 0  # the server's scheduling priority, lowered by this much (runtime.server_nice)


# A line of vLLM's log that says why it stopped: argparse's "error: ...", or a Python exception's last line.
_COMPLAINT = re.compile(r"(?:^|\s)(?:[\w.-]+: error: .*|(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception): .*"
                        # a container engine's own refusal (docker run / podman run exit 125)
                        r"|(?:docker: )?Error(?: response from daemon)?: .*)$")


def complaint(path: Path) -> str:
    """vLLM's own reason for stopping, from its log: the last line that reads like one (else the last line)."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no server log)"
    said = [m.group(0).strip() for line in reversed(lines)
            if "speedmatrix:" not in line and (m := _COMPLAINT.search(line))]
    if not said:
        return lines[-1] if lines else "(empty server log)"
    if "root cause above" in said[0]:  # vLLM's API process only points at its engine's traceback: name the cause too
        cause = next((c for c in said[1:] if "root cause above" not in c), None)
        if cause:
            return f"{cause} ({said[0].split('. ')[0]})"
    if "validation error" in said[0]:  # pydantic says what was wrong on the next line: "Value error, ... [type=..."
        at = max(i for i, ln in enumerate(lines) if said[0] in ln)
        if at + 1 < len(lines):
            detail = lines[at + 1].removeprefix("Value error, ").split(" [type=")[0]
            return f"{said[0]}: {detail}"
    return said[0]


def wait_ready(proc: subprocess.Popen, url: str, timeout_s: float, log: Path,
                abort: Callable[[], str | None] = lambda: None) -> str | None:
    """Until the server answers; returns the model name it serves (its /v1/models listing's first, None if the
    listing names none). ``abort`` says why to give up early (a stop signal, the owner gone: a workflow
    interrupted during a start-up does not wait for the start-up to finish)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        why = abort()
        if why:
            raise RuntimeError(f"start-up abandoned: {why}")
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with code {proc.returncode} during start-up: {complaint(log)} "
                               f"(its log: {log})")
        try:
            code, _ = http_get(f"{url}/health", timeout=2)
            if code == 200:
                code, listing = http_get(f"{url}/v1/models", timeout=5)
                if code == 200:
                    return served_model(listing)
        except OSError:
            pass
        time.sleep(POLL_S)
    raise TimeoutError(f"vLLM did not serve {url} within {timeout_s:g} s (startup_timeout_s); its last words: "
                       f"{complaint(log)} (its log: {log})")


def served_model(listing: bytes) -> str | None:
    """The first model a /v1/models answer names."""
    try:
        return json.loads(listing)["data"][0]["id"]
    except (ValueError, LookupError, TypeError):
        return None


# Before a server is declared up it gets one greedy and one sampled completion, asking only what cells ask (their
# sampling, a prompt of some length): what vLLM compiles on its first sampled batch is not the first cell's to pay.
# Why, and what broke with a top_k or a two-token prompt: docs/decisions/0018-server-warm-up.md.
WARM_UP_REQUESTS = ({"temperature": 0.0}, {"temperature": 0.7, "top_p": 0.95})
WARM_UP_TIMEOUT_S = 60.0
WARM_UP_PROMPT = "def warm_up(server):\n    return server.answer(\"ready\")\n" * 4


def warm_up(url: str, model: str | None) -> dict[str, Any]:
    """The warm-up requests' outcome for ``startup.json``: seconds and HTTP codes, or why it could not (a server
    that refuses them still serves the cells; the cells say how it answers)."""
    t0 = time.monotonic()
    if model is None:
        return {"seconds": 0.0, "error": "the server's /v1/models names no model"}
    try:
        body = {"model": model, "prompt": WARM_UP_PROMPT, "max_tokens": 4}
        codes = [http_post_json(f"{url}/v1/completions", {**body, **s}, timeout=WARM_UP_TIMEOUT_S)[0]
                 for s in WARM_UP_REQUESTS]
    except OSError as exc:
        return {"seconds": round(time.monotonic() - t0, 3), "error": f"{type(exc).__name__}: {exc}"[:200]}
    return {"seconds": round(time.monotonic() - t0, 3), "status_codes": codes}


def startup_record(url: str) -> dict[str, Any]:
    _, version = http_get(f"{url}/version")
    _, text = http_get(f"{url}/metrics")
    info = metrics.cache_info(metrics.parse(text.decode()))
    return {
        "vllm_version": json.loads(version or b"{}").get("version"),
        **info,
        "max_concurrency": info["kv_cache_max_concurrency"],
    }


WEIGHTS_RE = re.compile(rb"Model loading took ([0-9.]+) GiB")


KV_LOG_RE = re.compile(rb"KV cache size: ([0-9,]+) tokens")


def model_weights_gib(log: Path) -> float | None:
    """GiB of weights a GPU worker loaded, as vLLM logs it ("Model loading took N GiB"), or None."""
    try:
        found = WEIGHTS_RE.findall(log.read_bytes())
    except OSError:
        return None
    return float(found[-1]) if found else None


def kv_tokens_from_log(log: Path) -> int | None:
    """The KV cache size vLLM logs at start ("GPU KV cache size: N tokens"), for servers whose
    metrics do not carry it (``kv_cache_size_tokens`` of vllm:cache_config_info is recent)."""
    try:
        found = KV_LOG_RE.findall(log.read_bytes())
    except OSError:
        return None
    return int(found[-1].replace(b",", b"")) if found else None


def _launch(a: BrokerArgs, argv: list[str], log_path: Path, start_id: str) -> subprocess.Popen:
    """vLLM in a process group of its own, its output appended to ``server.log`` after a start line."""
    with open(log_path, "ab") as log:
        log.write(f"\n==== speedmatrix: start {start_id} at {time.strftime('%Y-%m-%dT%H:%M:%S')}: "
                  f"{json.dumps(runtimes.redact_argv(a.argv))}\n".encode())
        log.flush()
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **a.env}, start_new_session=True,
                                preexec_fn=_lowered(a.nice) if a.nice else None)


def _lowered(nice: int):
    """Run in the server's process before vLLM starts (its session is new): its priority lowered by ``nice``, and
    its session's scheduling group too (Linux autogroup: the kernel shares a core between sessions first, so a
    process's own nice alone would not give way to the client's session). The client then gets the few
    milliseconds it needs when it needs them, on a host whose cores the server keeps busy (docs/decisions)."""
    def apply() -> None:
        os.nice(nice)
        with contextlib.suppress(OSError):
            Path("/proc/self/autogroup").write_text(str(nice))
    return apply


def _startup_doc(a: BrokerArgs, start_id: str, seconds: float, log_path: Path) -> dict[str, Any]:
    """``startup.json``: what started, how long it took, and what the server says of itself."""
    record = {
        "experiment": a.experiment,
        "server_id": a.server_id,
        "start_id": start_id,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "startup_seconds": round(seconds, 3),
        "url": a.url,
        "argv": runtimes.redact_argv(a.argv),
        "env": runtimes.redact_env(a.env),
        "hostname": socket.gethostname(),
        "model_weights_gib": model_weights_gib(log_path),
        # the pool's GPUs this server holds (CUDA_VISIBLE_DEVICES); None: the whole device
        "gpus": a.gpus,
        "nice": a.nice,
        **startup_record(a.url),
    }
    if record.get("kv_cache_size_tokens") is None:
        record["kv_cache_size_tokens"] = kv_tokens_from_log(log_path)
        record["kv_cache_size_source"] = "server log"
    return record


def _watch(a: BrokerArgs, proc: subprocess.Popen, state_dir: Path, stop: dict[str, str | None]) -> int:
    """Until a reason to stop (set in ``stop``): the API server died (return 3), the owner is gone, the
    server idled past ``idle_timeout_s`` with no cell holding its lease, or a signal."""
    lease = state_dir / state.LEASE
    lease.touch()
    while stop["reason"] is None:
        if proc.poll() is not None:
            stop["reason"] = f"vLLM API server exited with code {proc.returncode}"
            return 3
        if not owner_alive(a.owner):
            stop["reason"] = f"owner {a.owner} is gone"
            break
        try:
            idle = time.time() - lease.stat().st_mtime
        except FileNotFoundError:
            idle = 0.0
        if idle > a.idle_timeout_s and not state.lease_held(state_dir):
            stop["reason"] = f"idle for {idle:.0f} s"
            break
        time.sleep(POLL_S)
    return 0


def _end(a: BrokerArgs, proc: subprocess.Popen, state_dir: Path, log_path: Path, start_id: str, reason: str) -> None:
    """The server's whole process group ended, its container removed, the broker files gone, and why in
    ``server.log`` (on a line of its own)."""
    end_group(proc.pid)
    with contextlib.suppress(ProcessLookupError, ChildProcessError, subprocess.TimeoutExpired):
        proc.wait(timeout=1)
    if proc.returncode != DOCKER_OWN_ERROR:
        # the container we started outlives its killed client: remove it. Exit 125 is docker's
        # own error (a name already in use among them): then the container is not ours
        run_stop_argv(a.stop_argv)
    for name in (state.RUNNING, state.STARTING):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / name).unlink()
    with open(log_path, "ab+") as log:
        # on a line of its own, also when the server's last output did not end its line
        ended = log.seek(0, os.SEEK_END) == 0 or (log.seek(-1, os.SEEK_END) >= 0 and log.read(1) == b"\n")
        log.write(("" if ended else "\n").encode() + f"==== speedmatrix: stopped {start_id}: {reason}\n".encode())


def run_broker(a: BrokerArgs) -> int:
    """The broker process: start vLLM, wait until it serves, record the start, watch it, end it."""
    state_dir = a.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / state.SERVER_LOG
    start_id = uuid.uuid4().hex[:12]
    stop: dict[str, str | None] = {"reason": None}

    def on_signal(signum, _frame):
        if stop["reason"] is None:  # keep the first reason (e.g. the API server's death)
            stop["reason"] = f"signal {signal.Signals(signum).name}"

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        argv = runtimes.resolve_env_placeholders(a.argv, os.environ)
    except ValueError as exc:
        atomic.write_json(state_dir / state.STARTUP_ERROR, {"start_id": start_id, "owner": a.owner, "error": str(exc)})
        return 2
    # what the server's GPUs draw before it starts (NVML; None on the CPU): energy above idle in every cell
    idle = telemetry.idle_power(a.env)
    # how fast one of the host's cores runs Python just before the start: a host-bound server's pace
    probe = host.speed_probe()
    t_start = time.monotonic()
    proc = _launch(a, argv, log_path, start_id)
    live = {"broker_pid": os.getpid(), "vllm_pid": proc.pid, "pgid": proc.pid, "url": a.url, "token": a.token,
            "start_id": start_id, "owner": a.owner, "server_id": a.server_id,
            "hostname": socket.gethostname(), "scope": state.device_scope(), "stop_argv": a.stop_argv,
            "gpus": a.gpus}
    atomic.write_json(state_dir / state.STARTING, live)
    try:
        try:
            model = wait_ready(
                proc, a.url, a.startup_timeout_s, log_path,
                abort=lambda: stop["reason"] or (None if owner_alive(a.owner) else f"owner {a.owner} is gone"))
        except (RuntimeError, TimeoutError) as exc:
            atomic.write_json(state_dir / state.STARTUP_ERROR,
                              {"start_id": start_id, "owner": a.owner, "error": str(exc)})
            return 2
        record = _startup_doc(a, start_id, time.monotonic() - t_start, log_path)
        record.update(idle or {})
        record.update(probe)
        record["warm_up"] = warm_up(a.url, model)
        atomic.write_json(state_dir / state.STARTUP, record)
        with open(state_dir / state.STARTS, "a") as fh:
            fh.write(json.dumps({"start_id": start_id, "at": record["started_at"],
                                 "startup_seconds": record["startup_seconds"]}) + "\n")
        atomic.write_json(state_dir / state.RUNNING, {**live, "startup": record})
        return _watch(a, proc, state_dir, stop)
    finally:
        _end(a, proc, state_dir, log_path, start_id, stop["reason"] or "start-up failed")


DOCKER_OWN_ERROR = 125


def run_stop_argv(argv: list[str] | None) -> None:
    """Remove what outlives the process group (a docker container); quiet when there is nothing."""
    if not argv:
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)


def running_brokers(results_root: Path, scope: str | None = None) -> list[tuple[Path, dict]]:
    """Brokers on this host under ``results_root`` (only those of ``scope`` if given)."""
    out = []
    for state_dir in sorted(p for p in results_root.glob("*/servers/*") if p.is_dir()):
        info = (atomic.read_json_if_there(state_dir / state.RUNNING)
                or atomic.read_json_if_there(state_dir / state.STARTING))
        if not info or info.get("hostname", socket.gethostname()) != socket.gethostname():
            continue  # another node's broker: its own allocation ends it
        if scope is not None and info.get("scope") != scope:
            continue
        out.append((state_dir, info))
    return out


def stop_broker(state_dir: Path, info: dict, grace_s: float = 30.0) -> None:
    """Stop a broker and make sure its server's whole process group is gone."""
    bpid = int(info["broker_pid"])
    with contextlib.suppress(ProcessLookupError):
        os.kill(bpid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and pid_alive(bpid):
        time.sleep(0.2)
    if pid_alive(bpid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(bpid, signal.SIGKILL)
    # the broker may have been killed before cleaning up: end the group ourselves
    if group_alive(int(info["pgid"])):
        end_group(int(info["pgid"]), grace_s=5)
    run_stop_argv(info.get("stop_argv"))
    for name in (state.RUNNING, state.STARTING):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / name).unlink()


def stop_all(results_root: str | Path) -> int:
    """Stop every server brokered under ``results_root``; returns how many."""
    found = running_brokers(Path(results_root))
    for state_dir, info in found:
        stop_broker(state_dir, info)
    return len(found)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="speedmatrix server broker (started by the cells, not by hand)")
    p.parse_args(argv)
    spec = json.loads(sys.stdin.read())
    return run_broker(BrokerArgs(state_dir=Path(spec["state_dir"]), argv=spec["argv"], env=spec["env"],
                                 url=spec["url"], startup_timeout_s=spec["startup_timeout_s"],
                                 idle_timeout_s=spec["idle_timeout_s"], owner=spec["owner"],
                                 server_id=spec["server_id"], experiment=spec["experiment"],
                                 token=spec.get("token", ""), stop_argv=spec.get("stop_argv"),
                                 gpus=spec.get("gpus"), nice=int(spec.get("nice") or 0)))


if __name__ == "__main__":
    sys.exit(main())
