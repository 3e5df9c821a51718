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

from .experiment import Experiment


def _command_problem(argv0: str) -> str | None:
    exe = Path(argv0).expanduser()
    if exe.is_absolute() or "/" in argv0:
        return None if exe.exists() else f"runtime.command: {exe} does not exist"
    return None if shutil.which(argv0) else f"runtime.command: {argv0} is not on PATH"


def problems(exp: Experiment) -> list[str]:
    rt, out = exp.runtime, []
    kind = rt["kind"]
    if kind == "local":
        if rt.get("command"):
            problem = _command_problem(rt["command"][0])
            if problem:
                out.append(f"{exp.path}: key '{problem.split(':')[0]}': {problem.split(': ', 1)[1]} (give the "
                           "argv of the vLLM installation that serves this experiment)")
        elif importlib.util.find_spec("vllm") is None:
            out.append(f"{exp.path}: runtime 'local' runs vLLM from this Python, which has none: install the "
                       "engine (`make install`, or pip install '.[cpu]' for the CPU build) or give runtime.command")
    elif kind == "docker":
        if shutil.which("docker") is None:
            out.append(f"{exp.path}: runtime 'docker' needs the docker command, which is not on PATH")
        else:
            try:
                proc = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                                      text=True, timeout=20)
                if proc.returncode != 0:
                    out.append(f"{exp.path}: runtime 'docker': the Docker daemon does not answer "
                               f"({(proc.stderr.strip().splitlines() or ['no reason given'])[-1]}); start it "
                               "(e.g. `systemctl start docker`) and run again")
            except subprocess.TimeoutExpired:
                out.append(f"{exp.path}: runtime 'docker': `docker version` did not answer within 20 s")
    elif kind == "apptainer" and not (shutil.which("apptainer") or shutil.which("singularity")):
        out.append(f"{exp.path}: runtime 'apptainer' needs apptainer (or singularity) on PATH")
    return out


def api_keys(exp: Experiment) -> list[str]:
    """Variables that hold a server's --api-key and are not set: each gets a key generated for this run.
    Returns their names (to say so); the keys themselves go nowhere but this process's environment."""
    generated = []
    for name in sorted({s.api_key_env for s in exp.servers if s.api_key_env}):
        if not os.environ.get(name):
            os.environ[name] = secrets.token_urlsafe(24)
            generated.append(name)
    return generated
