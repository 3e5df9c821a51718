"""Server lifecycle: one vLLM server per server config per workflow run, owned by a broker.

Why a broker (docs/decisions/0001-server-lifecycle.md): every cell is its own
Snakemake job, so no job can own a server that the next cell reuses. The
first cell of a server config starts a small *broker* process, which starts
vLLM in a process group of its own, waits until it serves, writes
``startup.json`` and ``broker.json``, and then watches:

* the vLLM API server: if it dies, the broker ends the whole process group
  (vLLM's EngineCore and Worker survive a dead API server otherwise);
* its owner, the Snakemake main process (``SPEEDMATRIX_OWNER=host:pid``):
  when the workflow ends, however it ends, the server ends within a second;
* an idle timeout: no cell for ``idle_timeout_s`` ends it as a safety net;
* SIGTERM/SIGINT: the workflow's ``onsuccess``/``onerror`` stop it at once.

A cell holds the *device lock* (an ``flock``) from acquiring the server to
the end of its measurement: two cells never measure at the same time, and a
server is only ever replaced by another config's server between cells.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import atomic, metrics, runtimes
from .errors import SpeedmatrixError
from .pool import Placement

OWNER_ENV = "SPEEDMATRIX_OWNER"
# Snakemake sets these to the *job's* thread count in every job; a server
# started from a cell job must not inherit them (OMP_NUM_THREADS=2 on a vLLM
# CPU worker bound to one core made decode ~100x slower). A server config sets
# them explicitly in its `env` if it wants them.
JOB_THREAD_VARS = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                   "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
POLL_S = 0.5
STOP_GRACE_S = 15.0


def device_scope() -> str:
    """The devices a cell measures on: this host, or this host within one SLURM allocation.

    Cells in one scope are serialized and share one server at a time; other
    scopes (another node, another allocation) run in parallel.
    """
    scope = socket.gethostname()
    if os.environ.get("SLURM_JOB_ID"):
        scope += f"-slurm{os.environ['SLURM_JOB_ID']}"
    return scope


def owner_token() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


OWNER_SCOPE_ENV = "SPEEDMATRIX_OWNER_SCOPE"


def claim_ownership(main_process: bool) -> None:
    """Make this process the owner of the servers its jobs start.

    The workflow's main process always claims. On a cluster, the Snakemake
    process that runs a group job inside an allocation claims too (its scope,
    host plus allocation, differs from the inherited one); the per-job
    Snakemake processes it starts inside the same allocation do not, so a
    server lives as long as the group, not as long as one cell's step.
    """
    if main_process or os.environ.get(OWNER_SCOPE_ENV) != device_scope():
        os.environ[OWNER_ENV] = owner_token()
        os.environ[OWNER_SCOPE_ENV] = device_scope()


def _owner_alive(token: str | None) -> bool:
    if not token:
        return True
    host, _, pid = token.rpartition(":")
    if host != socket.gethostname():
        return True  # another host's process: cannot be watched from here
    try:
        return pid_alive(int(pid))  # a killed owner its parent has not reaped yet (a zombie) is gone
    except ValueError:
        return True


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child counts as gone
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # only zombies left counts as gone
    return bool(group_members(pgid))


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of a process group, from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().split(")")[-1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def end_group(pgid: int, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM a process group, then SIGKILL whatever is left after ``grace_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.1)


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={k: v for k, v in _auth().items()})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def _auth() -> dict[str, str]:
    from .client import auth_headers

    return auth_headers()


# ---------------------------------------------------------------------------
# the broker process


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
    for line in reversed(lines):
        m = _COMPLAINT.search(line)
        if m and "speedmatrix:" not in line:
            return m.group(0).strip()
    return lines[-1] if lines else "(empty server log)"


def _wait_ready(proc: subprocess.Popen, url: str, timeout_s: float, log: Path,
                abort: Callable[[], str | None] = lambda: None) -> None:
    """Until the server answers; ``abort`` says why to give up early (a stop signal, the owner gone: a
    workflow interrupted during a start-up does not wait for the start-up to finish)."""
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
                code, _ = http_get(f"{url}/v1/models", timeout=5)
                if code == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(POLL_S)
    raise TimeoutError(f"vLLM did not serve {url} within {timeout_s:g} s (startup_timeout_s); its last words: "
                       f"{complaint(log)} (its log: {log})")


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


def run_broker(a: BrokerArgs) -> int:
    state = a.state_dir
    state.mkdir(parents=True, exist_ok=True)
    log_path = state / "server.log"
    start_id = uuid.uuid4().hex[:12]
    stop = {"reason": None}

    def on_signal(signum, _frame):
        if stop["reason"] is None:  # keep the first reason (e.g. the API server's death)
            stop["reason"] = f"signal {signal.Signals(signum).name}"

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    env = {**os.environ, **a.env}
    try:
        argv = runtimes.resolve_env_placeholders(a.argv, os.environ)
    except ValueError as exc:
        atomic.write_json(state / "startup-error.json", {"start_id": start_id, "owner": a.owner, "error": str(exc)})
        return 2
    with open(log_path, "ab") as log:
        log.write(f"\n==== speedmatrix: start {start_id} at {time.strftime('%Y-%m-%dT%H:%M:%S')}: "
                  f"{json.dumps(runtimes.redact_argv(a.argv))}\n".encode())
        log.flush()
        t_start = time.monotonic()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    pgid = proc.pid
    live = {"broker_pid": os.getpid(), "vllm_pid": proc.pid, "pgid": pgid, "url": a.url, "token": a.token,
            "start_id": start_id, "owner": a.owner, "server_id": a.server_id,
            "hostname": socket.gethostname(), "scope": device_scope(), "stop_argv": a.stop_argv,
            "gpus": a.gpus}
    atomic.write_json(state / "broker.starting.json", live)
    rc = 0
    try:
        try:
            _wait_ready(proc, a.url, a.startup_timeout_s, log_path,
                        abort=lambda: stop["reason"] or (None if _owner_alive(a.owner) else f"owner {a.owner} is gone"))
        except (RuntimeError, TimeoutError) as exc:
            atomic.write_json(state / "startup-error.json",
                              {"start_id": start_id, "owner": a.owner, "error": str(exc)})
            return 2
        record = {
            "experiment": a.experiment,
            "server_id": a.server_id,
            "start_id": start_id,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "startup_seconds": round(time.monotonic() - t_start, 3),
            "url": a.url,
            "argv": runtimes.redact_argv(a.argv),
            "env": runtimes.redact_env(a.env),
            "hostname": socket.gethostname(),
            "model_weights_gib": model_weights_gib(log_path),
            # the pool's GPUs this server holds (CUDA_VISIBLE_DEVICES); None: the whole device
            "gpus": a.gpus,
            **startup_record(a.url),
        }
        if record.get("kv_cache_size_tokens") is None:
            record["kv_cache_size_tokens"] = kv_tokens_from_log(log_path)
            record["kv_cache_size_source"] = "server log"
        atomic.write_json(state / "startup.json", record)
        with open(state / "starts.jsonl", "a") as fh:
            fh.write(json.dumps({"start_id": start_id, "at": record["started_at"],
                                 "startup_seconds": record["startup_seconds"]}) + "\n")
        atomic.write_json(state / "broker.json", {**live, "startup": record})
        lease = state / "lease"
        lease.touch()
        while stop["reason"] is None:
            if proc.poll() is not None:
                stop["reason"] = f"vLLM API server exited with code {proc.returncode}"
                rc = 3
                break
            if not _owner_alive(a.owner):
                stop["reason"] = f"owner {a.owner} is gone"
                break
            try:
                idle = time.time() - lease.stat().st_mtime
            except FileNotFoundError:
                idle = 0.0
            if idle > a.idle_timeout_s and not _lease_held(state):
                stop["reason"] = f"idle for {idle:.0f} s"
                break
            time.sleep(POLL_S)
        return rc
    finally:
        end_group(pgid)
        with contextlib.suppress(ProcessLookupError, ChildProcessError, subprocess.TimeoutExpired):
            proc.wait(timeout=1)
        if proc.returncode != DOCKER_OWN_ERROR:
            # the container we started outlives its killed client: remove it. Exit 125 is docker's
            # own error (a name already in use among them): then the container is not ours
            _run_stop_argv(a.stop_argv)
        for name in ("broker.json", "broker.starting.json"):
            with contextlib.suppress(FileNotFoundError):
                (state / name).unlink()
        with open(log_path, "ab+") as log:
            # on a line of its own, also when the server's last output did not end its line
            ended = log.seek(0, os.SEEK_END) == 0 or (log.seek(-1, os.SEEK_END) >= 0 and log.read(1) == b"\n")
            log.write(("" if ended else "\n").encode()
                      + f"==== speedmatrix: stopped {start_id}: {stop['reason'] or 'start-up failed'}\n".encode())


DOCKER_OWN_ERROR = 125


def _run_stop_argv(argv: list[str] | None) -> None:
    """Remove what outlives the process group (a docker container); quiet when there is nothing."""
    if not argv:
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)


def _lease_held(state: Path) -> bool:
    """A cell holds the server while it measures (the flock on ``lease``)."""
    try:
        with open(state / "lease", "rb") as fh:
            # cells hold a shared lock while they measure: an exclusive try fails then
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fh, fcntl.LOCK_UN)
            return False
    except BlockingIOError:
        return True
    except FileNotFoundError:
        return False


# ---------------------------------------------------------------------------
# the side of the cells


class ServerError(SpeedmatrixError, RuntimeError):
    """A server config's server could not be started or held; the message names the config and vLLM's reason."""


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def running_brokers(results_root: Path, scope: str | None = None) -> list[tuple[Path, dict]]:
    """Brokers on this host under ``results_root`` (only those of ``scope`` if given)."""
    out = []
    for state_dir in sorted(p for p in results_root.glob("*/servers/*") if p.is_dir()):
        info = _read(state_dir / "broker.json") or _read(state_dir / "broker.starting.json")
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
    _run_stop_argv(info.get("stop_argv"))
    for name in ("broker.json", "broker.starting.json"):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / name).unlink()


def stop_all(results_root: str | Path) -> int:
    """Stop every server brokered under ``results_root``; returns how many."""
    found = running_brokers(Path(results_root))
    for state_dir, info in found:
        stop_broker(state_dir, info)
    return len(found)


@contextlib.contextmanager
def device_lock(results_root: Path) -> Iterator[None]:
    lock_dir = results_root / ".devices"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{device_scope()}.lock", "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def healthy(info: dict) -> bool:
    """The broker and the API server of ``info`` are alive and ``/health`` answers 200."""
    if not pid_alive(int(info["broker_pid"])) or not pid_alive(int(info["vllm_pid"])):
        return False
    try:
        return http_get(f"{info['url']}/health", timeout=5)[0] == 200
    except (urllib.error.URLError, OSError):
        return False


def broker_command() -> list[str]:
    """The broker's argv. Inside a SLURM allocation it is a job step of its own
    (``srun --overlap --whole``): it outlives the cell's step that started it
    (on clusters that track a step's processes by cgroup, a plain child would
    end with that step), has the node's whole allocation (CPUs, GPUs, memory),
    and SLURM ends it with the allocation at the latest."""
    cmd = [sys.executable, "-m", "speedmatrix.server"]
    if os.environ.get("SLURM_JOB_ID") and shutil.which("srun"):
        cmd = ["srun", "--overlap", "--whole", "--nodes=1", "--ntasks=1", f"--nodelist={socket.gethostname()}",
               "--job-name=speedmatrix-server", "--input=0", *cmd]
    return cmd


def spawn_broker(state_dir: Path, argv_without_port: list[str], host: str, port: int,
                 env: dict[str, str], startup_timeout_s: float, idle_timeout_s: float, server_id: str,
                 experiment: str, progress=print, stop_argv: list[str] | None = None,
                 gpus: list[str] | None = None) -> dict:
    """Start a server's broker and return once it has registered (``broker.starting.json``, with the GPUs
    it holds): from then on other cells see those GPUs as taken, so the wait for vLLM to serve
    (``await_broker``) needs no lock and servers on disjoint GPUs start at the same time."""
    port = port or free_port(host)
    argv = [item.replace(runtimes.PORT_PLACEHOLDER, str(port)) for item in argv_without_port]
    runtimes.resolve_env_placeholders(argv, os.environ)  # a missing secret fails here, before anything starts
    url = f"http://{host}:{port}"
    for name in ("startup-error.json", "broker.json"):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / name).unlink()
    token = uuid.uuid4().hex
    spec = {"state_dir": str(state_dir), "argv": argv, "env": env, "url": url,
            "startup_timeout_s": startup_timeout_s, "idle_timeout_s": idle_timeout_s,
            "owner": os.environ.get(OWNER_ENV), "server_id": server_id, "experiment": experiment,
            "token": token, "stop_argv": stop_argv, "gpus": gpus}
    state_dir.mkdir(parents=True, exist_ok=True)
    progress(f"starting server {server_id} at {url}")
    # the spec goes through a pipe, not a file: the argv may hold a secret (--api-key)
    broker_env = {k: v for k, v in os.environ.items() if k not in JOB_THREAD_VARS}
    with open(state_dir / "broker.log", "ab") as blog:
        broker = subprocess.Popen(broker_command(), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  stderr=blog, start_new_session=True, env=broker_env)
    broker.stdin.write(json.dumps(spec).encode())
    broker.stdin.close()
    pending = {"broker": broker, "token": token, "state_dir": state_dir, "server_id": server_id,
               "t0": time.monotonic()}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for name in ("broker.starting.json", "broker.json"):
            info = _read(state_dir / name)
            if info and info.get("token") == token:
                return pending
        if broker.poll() is not None:
            return pending  # it failed at once: await_broker says why
        time.sleep(0.05)
    return pending


def await_broker(pending: dict, progress=print) -> dict:
    """Wait until the broker's vLLM serves; its ``broker.json``."""
    broker, token, state_dir, server_id, t0 = (pending[k] for k in ("broker", "token", "state_dir", "server_id",
                                                                    "t0"))
    last = 0.0
    while True:
        info = _read(state_dir / "broker.json")
        if info and info.get("token") == token:
            progress(f"server {server_id} ready after {time.monotonic() - t0:.1f} s")
            return info
        if broker.poll() is not None:
            err = _read(state_dir / "startup-error.json") or {}
            raise ServerError(f"server {server_id} failed to start: "
                              f"{err.get('error') or 'broker exited ' + str(broker.returncode)}")
        if time.monotonic() - last > 15:
            last = time.monotonic()
            progress(f"waiting for server {server_id} ({time.monotonic() - t0:.0f} s)")
        time.sleep(POLL_S)


def _held_units(info: dict, units: tuple[str, ...]) -> set[str]:
    """What a running server holds: its GPUs, or the whole device (a server started without a pool)."""
    held = info.get("gpus")
    return set(units) if not held else set(held) & set(units) or set(units)


def place(results_root: Path, state_dir: Path, placement: Placement, progress=print) -> list[str] | None:
    """Units for a new server of ``state_dir``'s config (called under the device lock): free ones
    first; then the units of idle servers of other configs, which are stopped; None when the rest are
    held by servers that are measuring (the caller waits)."""
    units = placement.units
    need = placement.need()
    others = [(d, i) for d, i in running_brokers(results_root, scope=device_scope()) if d != state_dir]
    held: dict[str, tuple[Path, dict]] = {}
    for d, i in others:
        for u in _held_units(i, units):
            held[u] = (d, i)
    free = [u for u in units if u not in held]
    if len(free) < need:
        for d, i in others:
            if len(free) >= need:
                break
            if _lease_held(d) or "startup" not in i:
                continue  # a cell is measuring on it (or will: it is still starting)
            what = ", ".join(sorted(_held_units(i, units)))
            progress(f"stopping server {i.get('server_id')} (idle) to free {what}")
            stop_broker(d, i)
            free += [u for u in units if held.get(u, (None,))[0] == d]
    if len(free) < need:
        return None
    free = [u for u in units if u in free]  # in the pool's order
    return free[:need]


@contextlib.contextmanager
def acquire(results_root: Path, experiment: str, server_id: str, launch: dict, idle_timeout_s: float,
            progress=print, placement: Placement | None = None, label: str = "") -> Iterator[dict]:
    """Hold a running server for ``server_id`` for the duration of a cell (starting it if needed).

    Under the device lock (short: no measurement inside it) the server is found or started on units of
    the pool (``placement``): without a pool one server runs at a time and another config's server is
    stopped first. Then the cell holds its server's lease and the measure lock: shared when it may
    measure beside cells of other configs, exclusive when isolated (always without a pool). On return
    ``info["beside"]`` lists the other cells that measured during this one.
    """
    placement = placement or Placement()
    state_dir = results_root / experiment / "servers" / server_id
    lease = state_dir / "lease"
    waited, pending = 0.0, None
    while True:
        with device_lock(results_root):
            info = _read(state_dir / "broker.json")
            if info and not healthy(info):
                progress(f"server {server_id} (start {info.get('start_id')}) is not healthy: replacing it")
                stop_broker(state_dir, info)
                info = None
            if info is None:
                failed = _read(state_dir / "startup-error.json")
                if failed and failed.get("owner") and failed.get("owner") == os.environ.get(OWNER_ENV):
                    # one failed start per run: the other cells of this config fail fast
                    raise ServerError(f"server {server_id} failed to start earlier in this run: {failed['error']}")
                units = place(results_root, state_dir, placement, progress)
                if units is not None:
                    env = dict(launch["env"])
                    if placement.pool:
                        env["CUDA_VISIBLE_DEVICES"] = ",".join(units)
                        progress(f"server {server_id} takes GPU {','.join(units)} of the pool "
                                 f"{','.join(placement.pool)}")
                    pending = spawn_broker(state_dir, launch["argv"], launch["host"], launch["port"], env,
                                           launch["startup_timeout_s"], idle_timeout_s, server_id, experiment,
                                           progress, launch.get("stop_argv"), units if placement.pool else None)
            if info is not None or pending is not None:
                state_dir.mkdir(parents=True, exist_ok=True)
                lease.touch()
                fh = open(lease, "rb")  # noqa: SIM115 (held until the cell ends, below)
                fcntl.flock(fh, fcntl.LOCK_SH)  # before the device lock is let go: not idle from now on
                break
        if waited % 30 < POLL_S * 2:
            progress(f"server {server_id} waits for {placement.need()} GPU(s): the pool's are held by "
                     f"servers that are starting or measuring")
        time.sleep(POLL_S * 2)
        waited += POLL_S * 2
    try:
        if pending is not None:
            info = await_broker(pending, progress)  # no lock held: servers on other GPUs start meanwhile
        with measure_lock(results_root, exclusive=placement.isolated or not placement.pool), \
                _measuring(results_root, experiment, server_id, label) as beside:
            try:
                yield info
            finally:
                info["beside"] = beside()
    finally:
        lease.touch()
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


@contextlib.contextmanager
def measure_lock(results_root: Path, exclusive: bool) -> Iterator[None]:
    """Cells that may run side by side hold it shared; an isolated cell holds it alone."""
    lock_dir = results_root / ".devices"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{device_scope()}.measure.lock", "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def _measuring(results_root: Path, experiment: str, server_id: str, label: str) -> Iterator[Callable[[], list]]:
    """Register this measurement on the host; yield a function that names every other measurement
    that overlapped it (running at its start or end, or one that ended during it)."""
    d = results_root / ".devices" / f"{device_scope()}.measuring"
    d.mkdir(parents=True, exist_ok=True)
    journal = results_root / ".devices" / f"{device_scope()}.measured.jsonl"
    me = {"experiment": experiment, "server_id": server_id, "cell": label, "pid": os.getpid(),
          "start": time.time()}
    mine = d / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.json"

    def current() -> list[dict]:
        out = []
        for f in d.glob("*.json"):
            if f != mine:
                doc = _read(f)
                if doc and pid_alive(int(doc.get("pid", 0))):
                    out.append(doc)
        return out

    at_start = current()
    atomic.write_json(mine, me)

    def beside() -> list[dict[str, Any]]:
        seen = at_start + current()
        with contextlib.suppress(FileNotFoundError):
            for line in journal.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    doc = json.loads(line)
                    if doc.get("end", 0) > me["start"]:
                        seen.append(doc)
        out, keys = [], set()
        for doc in seen:
            key = (doc.get("experiment"), doc.get("server_id"), doc.get("cell"))
            if key not in keys and doc.get("pid") != me["pid"]:
                keys.add(key)
                out.append({"experiment": key[0], "server_id": key[1], "cell": key[2]})
        return sorted(out, key=lambda x: (str(x["server_id"]), str(x["cell"])))

    try:
        yield beside
    finally:
        with contextlib.suppress(FileNotFoundError):
            mine.unlink()
        with open(journal, "a") as fh:
            fh.write(json.dumps({**me, "end": time.time()}) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="speedmatrix server broker (started by the cells, not by hand)")
    p.parse_args(argv)
    spec = json.loads(sys.stdin.read())
    return run_broker(BrokerArgs(state_dir=Path(spec["state_dir"]), argv=spec["argv"], env=spec["env"],
                                 url=spec["url"], startup_timeout_s=spec["startup_timeout_s"],
                                 idle_timeout_s=spec["idle_timeout_s"], owner=spec["owner"],
                                 server_id=spec["server_id"], experiment=spec["experiment"],
                                 token=spec.get("token", ""), stop_argv=spec.get("stop_argv"),
                                 gpus=spec.get("gpus")))


if __name__ == "__main__":
    sys.exit(main())
