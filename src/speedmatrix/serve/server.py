"""Server lifecycle, the cells' side: find or start a server config's server and hold it for a cell.

One vLLM server per server config per workflow run, owned by a broker
(speedmatrix.serve.broker). A cell holds the *device lock* (an ``flock``) while it
finds or starts its server, then the server's lease and the measure lock
(speedmatrix.serve.placement) until its measurement ends: a server is only ever
replaced by another config's server between cells, and two cells measure at
once only on disjoint GPUs of a pool.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from ..core import atomic
from ..core.errors import ServerError
from ..core.runfolder import RunFolder
from . import runtimes, state
from .broker import running_brokers, stop_broker
from .placement import measure_lock, measuring, place
from .pool import Placement
from .procs import OWNER_ENV, POLL_S, free_port, http_get, pid_alive

# Snakemake sets these to the *job's* thread count in every job; a server
# started from a cell job must not inherit them (OMP_NUM_THREADS=2 on a vLLM
# CPU worker bound to one core made decode ~100x slower). A server config sets
# them explicitly in its `env` if it wants them.
JOB_THREAD_VARS = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                   "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def device_lock(results_root: Path) -> contextlib.AbstractContextManager[None]:
    """One cell at a time finds or starts a server in this scope."""
    return state.flocked(state.device_lock_file(results_root))


def healthy(info: dict) -> bool:
    """The broker and the API server of ``info`` are alive and ``/health`` answers 200."""
    if not pid_alive(int(info["broker_pid"])) or not pid_alive(int(info["vllm_pid"])):
        return False
    try:
        return http_get(f"{info['url']}/health", timeout=5)[0] == 200
    except OSError:
        return False


def broker_command() -> list[str]:
    """The broker's argv. Inside a SLURM allocation it is a job step of its own
    (``srun --overlap --whole``): it outlives the cell's step that started it
    (on clusters that track a step's processes by cgroup, a plain child would
    end with that step), has the node's whole allocation (CPUs, GPUs, memory),
    and SLURM ends it with the allocation at the latest."""
    cmd = [sys.executable, "-m", "speedmatrix.serve.broker"]
    if os.environ.get("SLURM_JOB_ID") and shutil.which("srun"):
        cmd = ["srun", "--overlap", "--whole", "--nodes=1", "--ntasks=1", f"--nodelist={socket.gethostname()}",
               "--job-name=speedmatrix-server", "--input=0", *cmd]
    return cmd


def spawn_broker(state_dir: Path, argv_without_port: list[str], host: str, port: int,
                 env: dict[str, str], startup_timeout_s: float, idle_timeout_s: float, server_id: str,
                 experiment: str, progress=print, stop_argv: list[str] | None = None,
                 gpus: list[str] | None = None, nice: int = 0) -> dict:
    """Start a server's broker and return once it has registered (``broker.starting.json``, with the GPUs
    it holds): from then on other cells see those GPUs as taken, so the wait for vLLM to serve
    (``await_broker``) needs no lock and servers on disjoint GPUs start at the same time."""
    port = port or free_port(host)
    argv = [item.replace(runtimes.PORT_PLACEHOLDER, str(port)) for item in argv_without_port]
    runtimes.resolve_env_placeholders(argv, os.environ)  # a missing secret fails here, before anything starts
    url = f"http://{host}:{port}"
    for name in (state.STARTUP_ERROR, state.RUNNING):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / name).unlink()
    token = uuid.uuid4().hex
    spec = {"state_dir": str(state_dir), "argv": argv, "env": env, "url": url,
            "startup_timeout_s": startup_timeout_s, "idle_timeout_s": idle_timeout_s,
            "owner": os.environ.get(OWNER_ENV), "server_id": server_id, "experiment": experiment,
            "token": token, "stop_argv": stop_argv, "gpus": gpus, "nice": nice}
    state_dir.mkdir(parents=True, exist_ok=True)
    progress(f"starting server {server_id} at {url}")
    # the spec goes through a pipe, not a file: the argv may hold a secret (--api-key)
    broker_env = {k: v for k, v in os.environ.items() if k not in JOB_THREAD_VARS}
    with open(state_dir / state.BROKER_LOG, "ab") as blog:
        broker = subprocess.Popen(broker_command(), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  stderr=blog, start_new_session=True, env=broker_env)
    broker.stdin.write(json.dumps(spec).encode())
    broker.stdin.close()
    pending = {"broker": broker, "token": token, "state_dir": state_dir, "server_id": server_id,
               "t0": time.monotonic()}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for name in (state.STARTING, state.RUNNING):
            info = atomic.read_json_if_there(state_dir / name)
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
        info = atomic.read_json_if_there(state_dir / state.RUNNING)
        if info and info.get("token") == token:
            progress(f"server {server_id} ready after {time.monotonic() - t0:.1f} s")
            return info
        if broker.poll() is not None:
            err = atomic.read_json_if_there(state_dir / state.STARTUP_ERROR) or {}
            raise ServerError(f"server {server_id} failed to start: "
                              f"{err.get('error') or 'broker exited ' + str(broker.returncode)}")
        if time.monotonic() - last > 15:
            last = time.monotonic()
            progress(f"waiting for server {server_id} ({time.monotonic() - t0:.0f} s)")
        time.sleep(POLL_S)


def running_same_launch(results_root: Path, own_dir: Path, launch: dict) -> tuple[Path, dict] | None:
    """Another config's healthy server in this device scope, started by this workflow (the same owner), whose
    launch is ``launch``: its state folder and broker record."""
    owner = os.environ.get(OWNER_ENV)
    for d, info in running_brokers(results_root, scope=state.device_scope()):
        if d == own_dir or d.parent != own_dir.parent or not owner or info.get("owner") != owner:
            continue
        other = atomic.read_json_if_there(d / state.LAUNCH)
        if other and runtimes.same_launch(other, launch) and "startup" in info and healthy(info):
            return d, info
    return None


@contextlib.contextmanager
def acquire(results_root: Path, experiment: str, server_id: str, launch: dict, idle_timeout_s: float,
            progress=print, placement: Placement | None = None, label: str = "") -> Iterator[dict]:
    """Hold a running server for ``server_id`` for the duration of a cell (starting it if needed).

    Under the device lock (short: no measurement inside it) the server is found or started on units of
    the pool (``placement``): without a pool one server runs at a time and another config's server is
    stopped first. Then the cell holds its server's lease and the measure lock: shared when it may
    measure beside cells of other configs, exclusive when isolated (always without a pool). On return
    ``info["beside"]`` lists the other cells that measured during this one.

    Without a pool, a config whose launch is another's (``runtimes.same_launch``: a sweep point that repeats a
    config listed before it) measures on that config's running server instead of starting its own: its
    cells' provenance names that start.
    """
    placement = placement or Placement()
    own_dir = RunFolder(results_root / experiment).server(server_id)
    waited, pending = 0.0, None
    lease_hold = contextlib.ExitStack()  # the shared lease on the server, taken below
    while True:
        with device_lock(results_root):
            state_dir = own_dir
            info = atomic.read_json_if_there(state_dir / state.RUNNING)
            if info and not healthy(info):
                progress(f"server {server_id} (start {info.get('start_id')}) is not healthy: replacing it")
                stop_broker(state_dir, info)
                info = None
            if info is None and not placement.pool:
                shared = running_same_launch(results_root, own_dir, launch)
                if shared:
                    state_dir, info = shared
                    progress(f"server {server_id} has the launch of {info.get('server_id')}: its running server "
                             f"(start {info.get('start_id')}) measures this config's cells")
            if info is None:
                failed = atomic.read_json_if_there(state_dir / state.STARTUP_ERROR)
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
                                           progress, launch.get("stop_argv"), units if placement.pool else None,
                                           int(launch.get("nice") or 0))
            if info is not None or pending is not None:
                state_dir.mkdir(parents=True, exist_ok=True)
                lease = state_dir / state.LEASE
                lease.touch()
                # before the device lock is let go: not idle from now on (held until the cell ends, below)
                lease_hold.enter_context(state.flocked(lease, shared=True))
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
                measuring(results_root, experiment, server_id, label) as beside:
            try:
                info["state_dir"] = str(state_dir)  # its log and records (another config's, if shared)
                yield info
            finally:
                info["beside"] = beside()
    finally:
        lease.touch()
        lease_hold.close()


