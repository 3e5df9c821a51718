"""Checks before any job runs (the Snakefile's ``onstart``): what the run needs from this machine.

Everything that can fail the same way for every job is checked once, in
seconds, with one message that says what to do: the engine a local runtime
runs, a runtime's own command, a container engine and its daemon, the API
keys servers take from the environment. A server the run starts itself may
take a key generated for the run when its variable is not set: it lives in
this process's environment (the jobs and their servers inherit it) and is
never written anywhere.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import subprocess
from pathlib import Path

from ..core import atomic, fmt
from ..plan.experiment import Experiment
from . import reference


def _command_problem(argv0: str) -> str | None:
    exe = Path(argv0).expanduser()
    if exe.is_absolute() or "/" in argv0:
        return None if exe.exists() else f"runtime.command: {exe} does not exist"
    return None if shutil.which(argv0) else f"runtime.command: {argv0} is not on PATH"


def _engine_problems(exp: Experiment) -> list[str]:
    """The container engine is installed and answers (dockerd running): said once, before any job."""
    name = exp.runtime["engine"]
    if shutil.which(name) is None:
        return [f"{exp.path}: key 'runtime.engine': the {name} command is not on PATH: install it "
                f"(Debian: apt-get install {'docker.io' if name == 'docker' else name}; docs/containers.md)"]
    try:
        proc = subprocess.run([name, "info", "--format", "{{json .}}"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return [f"{exp.path}: runtime 'docker': `{name} info` did not answer within 30 s"]
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no reason given"])[-1]
        start = ("start the Docker daemon (`systemctl start docker`, or `dockerd &` where there is no "
                 "systemd; .ci/start-docker shows how)" if name == "docker" else "check `podman info`")
        return [f"{exp.path}: runtime 'docker' with engine {name}: the engine does not answer ({why}); "
                f"{start} and run again"]
    return []


def problems(exp: Experiment, cluster: bool = False) -> list[str]:
    """What this machine lacks for the run, one message each. ``cluster``: the servers run on a cluster's nodes, so a
    ``runtime.command`` that is not here may be theirs (the engine check says it was not checked)."""
    rt, out = exp.runtime, []
    kind = rt["kind"]
    if kind == "local":
        if rt.get("command"):
            problem = None if cluster else _command_problem(rt["command"][0])
            if problem:
                out.append(f"{exp.path}: key '{problem.split(':')[0]}': {problem.split(': ', 1)[1]} (give the "
                           "argv of the vLLM installation that serves this experiment)")
        elif importlib.util.find_spec("vllm") is None:
            out.append(f"{exp.path}: runtime 'local' runs vLLM from this Python, which has none: install the "
                       "engine (`make install`, or pip install '.[cpu]' for the CPU build) or give runtime.command")
    elif kind == "docker":
        out += _engine_problems(exp)
        if rt.get("host_python") and importlib.util.find_spec("vllm") is None:
            out.append(f"{exp.path}: key 'runtime.host_python': the container runs this Python's vLLM, and it has "
                       "none: install the engine (`make install`) or use an image that has vLLM")
    elif kind == "apptainer" and not (shutil.which("apptainer") or shutil.which("singularity")):
        out.append(f"{exp.path}: runtime 'apptainer' needs apptainer (or singularity) on PATH")
    return out + reference.problems(exp)


def api_keys(exp: Experiment) -> list[str]:
    """Variables that hold a server's --api-key and are not set: each gets a key generated for this run.
    Returns their names (to say so); the keys themselves go nowhere but this process's environment."""
    generated = []
    for name in sorted({s.api_key_env for s in exp.servers if s.api_key_env}):
        if not os.environ.get(name):
            os.environ[name] = secrets.token_urlsafe(24)
            generated.append(name)
    return generated


def moved_tag(exp: Experiment, lock_path: str | Path) -> str | None:
    """A container image's tag that names another digest now than the run's lock pinned: the run keeps
    the pinned image (a matrix never mixes images); said so once, before any job. None when the tag
    has not moved, there is no lock yet, the image is given by digest, or the registry cannot be asked
    (the pin itself says that when it needs the registry)."""
    from ..provision import registry

    rt = exp.runtime
    lock_path = Path(lock_path)
    if rt["kind"] not in ("docker", "apptainer") or not lock_path.is_file():
        return None
    try:
        lock = atomic.read_json(lock_path)
        if not lock.get("tag") or lock.get("image") != rt.get("image"):
            return None
        _, now = registry.resolve(rt["image"], rt.get("registry"), timeout=10)
    except (ValueError, OSError, registry.RegistryError):
        return None
    if now == lock.get("digest"):
        return None
    return (f"{exp.path}: the image tag {rt['image']!r} now names {now}; this run keeps the pinned "
            f"{lock['digest']} ({lock_path}). Delete that file to pin the new image, which measures every "
            "cell again")



RECORD = Path("docs") / "results" / "default" / "record.json"


def recorded_run(exp: Experiment, record: Path = RECORD) -> str | None:
    """What the last recorded run of this experiment took (bench/default_record.py's record), said before the run
    starts, where the record is of the experiment as it is now (the same digest); else None."""
    if not record.exists():
        return None
    rec = atomic.read_json(record)
    if rec.get("experiment") != exp.name or rec.get("experiment_digest") != exp.digest():
        return None
    return (f"the last recorded run of {exp.name} ({record.parent}/) had {rec['jobs']} jobs and took "
            f"{fmt.minutes(rec['first_run_s'])} on {rec['machine']}, after an install of "
            f"{fmt.minutes(rec['install_s'])}")
