"""An experiment checked against the runtime that will serve it, before anything is downloaded, started or queued.

``speedmatrix validate`` and the workflow's first step (``onstart``, on the machine where Snakemake runs: a login
node on a cluster) run the same check. vLLM's own code judges what only vLLM knows, run in the runtime's Python
(``serve.engineprobe``: its argument parser, its serve checks, its speculative config's methods, keys and types;
no engine start, no GPU); this module asks it, caches its answer under the runtime's pin (a second check of the
same flags on the same runtime starts no Python) and adds what follows from the experiment and the answer:

* the device: ``runtime.device: gpu`` served by a vLLM whose torch has neither CUDA nor ROCm is an error naming
  both; a config's tensor x pipeline parallel above the GPUs this node can give, likewise;
* lengths: each cell's prompt plus ``max_tokens`` against the config's max-model-len (vLLM's parse of its
  flags, else the model's own limit where its config is at hand), max-model-len against the model's own limit;
  a concurrency above max-num-seqs is a warning (that cell measures a queue);
* the models: a Hub repository that does not exist (asked of the Hub, nothing downloaded), or, offline, one
  that is not in the cache ("not checked, offline").

What cannot be checked here (an image not pulled, a command that exists only on the nodes, no network) is said,
with why, as a skipped check: never silently passed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..core import atomic
from ..core.errors import EngineCheckError
from ..plan.experiment import Experiment, ServerConfig
from ..serve import engineprobe, runtimes

MARKER = "SPEEDMATRIX-ENGINE-CHECK "
PROBE_TIMEOUT_S = 600


def cache_dir() -> Path:
    """Where vLLM's answers are kept, by runtime pin and request: the user's cache (shared by every checkout and
    results folder on the machine; any file in it may be deleted)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "speedmatrix" / "engine-check"


@dataclass
class Findings:
    """What the check found: errors (the run would fail), warnings (it would measure something else than asked),
    skipped checks with their reason, and what ran the check."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    checked_by: str | None = None
    cached: bool = False

    def lines(self) -> list[str]:
        out = []
        if self.checked_by:
            out.append(f"checked by {self.checked_by}" + (" (cached answer)" if self.cached else ""))
        out += [f"error: {m}" for m in self.errors]
        out += [f"warning: {m}" for m in self.warnings]
        out += [f"not checked: {m}" for m in self.skipped]
        return out


# ---------------------------------------------------------------------------------------------- the runtime's Python


@dataclass
class Target:
    """How to run Python in the runtime, and the pin its answers are cached under."""

    argv: list[str]
    pin: str
    where: str


def _python_beside(argv0: str) -> Path | None:
    exe = Path(argv0).expanduser()
    if not exe.is_absolute() and "/" not in argv0:
        found = shutil.which(argv0)
        exe = Path(found) if found else exe
    python = runtimes.command_python(exe)
    return python if python.is_file() else None


def target(exp: Experiment) -> Target | str:
    """The runtime's Python and its pin, or why the check cannot run here."""
    rt = exp.runtime
    kind = rt["kind"]
    if kind == "local" and rt.get("command"):
        argv0 = rt["command"][0]
        python = _python_beside(argv0)
        if python is None:
            return (f"runtime.command {argv0!r} has no Python beside it here (a command that exists only on the "
                    "nodes, or not a Python environment's): vLLM's checks of the flags and the device did not run")
        found = runtimes.environment_packages(python)
        if not found or not found.get("vllm_version"):
            return f"runtime.command {argv0!r}: its Python ({python}) has no vLLM here: vLLM's checks did not run"
        return Target([str(python)], f"local:{python}:{found['packages_sha256']}", str(python))
    if kind == "local" or (kind == "docker" and rt.get("host_python")):
        return Target([sys.executable], f"local:{sys.executable}:{runtimes.packages_digest()}", sys.executable)
    if kind == "docker":
        engine = runtimes.engine(exp)
        image = rt["image"]
        try:
            out = subprocess.run([engine, "image", "inspect", "--format", "{{.Id}}", image], capture_output=True,
                                 text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return f"runtime.image {image!r}: {engine} could not be asked whether the image is here"
        if out.returncode != 0:
            return (f"runtime.image {image!r} is not pulled here ({engine} image inspect): vLLM's checks of the "
                    f"flags and the device did not run; `{engine} pull {image}` first to check before the queue")
        return Target([engine, "run", "--rm", "-i", "--entrypoint", "python3", image],
                      f"docker:{out.stdout.strip()}", f"{image} ({engine})")
    image = rt["image"]
    path = Path(image.split("://", 1)[-1]).expanduser()
    if image.endswith(".sif") and path.is_file() and shutil.which("apptainer"):
        st = path.stat()
        return Target(["apptainer", "exec", str(path), "python3"], f"apptainer:{path}:{st.st_size}:{st.st_mtime_ns}",
                      str(path))
    return (f"runtime.image {image!r}: not an image file here with apptainer on PATH: vLLM's checks of the flags "
            "and the device did not run")


# ---------------------------------------------------------------------------------------------- the request, cached


def request_of(srv: ServerConfig) -> dict[str, Any]:
    """What vLLM is asked of one server config: each flag's arguments as the launch gives them (the model and the
    workflow's own host, port and key left out: they are not the user's to get wrong), its speculative config."""
    flags = [["served-model-name", ["--served-model-name", srv.served_model_name]]] \
        if srv.served_model_name_set else []
    flags += [[key, runtimes.flag_args({key: value})] for key, value in srv.args.items()]
    return {"flags": flags, "speculative": srv.speculative}


_PROBE_SHA = hashlib.sha256(Path(engineprobe.__file__).read_bytes()).hexdigest()[:16]


def _key(pin: str, req: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps([pin, _PROBE_SHA, req], sort_keys=True, default=str).encode()).hexdigest()


def ask(tgt: Target, requests: dict[str, dict[str, Any]], cache: Path) -> tuple[dict[str, Any], bool]:
    """vLLM's answer for every server config: from the cache where this runtime answered the same request before,
    else by running the probe once in the runtime's Python for the rest. Returns (answer, all from the cache)."""
    answers: dict[str, Any] = {}
    missing = {}
    for sid, req in requests.items():
        f = cache / f"{_key(tgt.pin, req)}.json"
        if f.is_file():
            try:
                answers[sid] = atomic.read_json(f)
                continue
            except ValueError:
                pass
        missing[sid] = req
    if not missing:
        return {"servers": {sid: a["server"] for sid, a in answers.items()},
                **next(iter(answers.values()))["runtime"]}, True
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONWARNINGS": "ignore"}
    try:
        proc = subprocess.run([*tgt.argv, "-c", Path(engineprobe.__file__).read_text()],
                              input=json.dumps({"servers": missing}), capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise EngineCheckError(f"the runtime's Python ({tgt.where}) did not answer in {PROBE_TIMEOUT_S} s") from None
    except OSError as e:
        raise EngineCheckError(f"the runtime's Python ({tgt.where}) could not be run: {e}") from None
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(MARKER)), None)
    if line is None:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}, no answer"])[-1]
        raise EngineCheckError(f"the runtime's Python ({tgt.where}) could not run vLLM's checks: {why}")
    got = json.loads(line[len(MARKER):])
    if "error" in got:
        raise EngineCheckError(f"{tgt.where}: {got['error']}")
    runtime = {k: v for k, v in got.items() if k != "servers"}
    for sid, ans in got["servers"].items():
        answers[sid] = {"runtime": runtime, "server": ans}
        atomic.write_json(cache / f"{_key(tgt.pin, missing[sid])}.json", answers[sid])
    return {"servers": {sid: a["server"] for sid, a in answers.items()}, **runtime}, False


# ---------------------------------------------------------------------------------------------- what follows


def _flag_key(key: str) -> str:
    return key if key.startswith("speculative.") or key == "args" else f"args.{key}"


def model_config(exp: Experiment, name: str, models_dir: str | Path) -> dict[str, Any] | None:
    """A model's config.json where it is at hand (a local model's folder, or the Hugging Face cache): nothing is
    downloaded."""
    m = exp.models[name]
    cfg_path: Path | None = None
    if "repo" in m:
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(m["repo"], "config.json", revision=m.get("revision"))
            cfg_path = Path(found) if isinstance(found, str) else None
        except Exception:  # a name the cache does not take: not at hand
            cfg_path = None
    else:
        cfg_path = Path(models_dir) / name / "config.json"
    if cfg_path is None or not cfg_path.is_file():
        return None
    try:
        return atomic.read_json(cfg_path)
    except ValueError:
        return None


def model_limit(exp: Experiment, name: str, models_dir: str | Path) -> int | None:
    """The model's own longest sequence, from its config where it is at hand."""
    cfg = model_config(exp, name, models_dir) or {}
    for c in (cfg, cfg.get("text_config") or {}):
        for key in ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions"):
            if isinstance(c.get(key), int):
                return c[key]
    return None


def _length_findings(exp: Experiment, srv: ServerConfig, ans: dict[str, Any], models_dir, out: Findings) -> None:
    where = f"{exp.path}: server config {srv.id!r}"
    own = model_limit(exp, srv.model, models_dir)
    given = ans.get("max_model_len")
    if given and own and given > own:
        out.errors.append(f"{where}, key 'args.max-model-len': {given:,} is above the model's own limit {own:,} "
                          f"({srv.model}'s config): vLLM refuses to start; lower it")
    limit, source = (given, "args.max-model-len") if given else (own, f"the model's own limit ({srv.model})")
    cells = exp.cells(srv.id)
    if limit:
        longest = {c.id: c.kind.longest_request(c) for c in cells}
        over = [c for c in cells if (longest[c.id] or 0) > limit]
        if over:
            worst = max(over, key=lambda c: longest[c.id])
            names = ", ".join(c.id for c in over[:3]) + (f" and {len(over) - 3} more" if len(over) > 3 else "")
            out.errors.append(
                f"{where}: {len(over)} cell(s) ask more tokens a request than max-model-len {limit:,} ({source}): "
                f"{names} (the longest: {longest[worst.id]:,} tokens, its prompt and output at max_tokens); vLLM "
                "refuses such a request, or cuts its output short, depending on the release: raise max-model-len "
                "or shorten the context or max_tokens")
    seqs = ans.get("max_num_seqs")
    if seqs:
        queued = sorted({c.concurrency for c in cells if c.concurrency > seqs})
        if queued:
            out.warnings.append(
                f"{where}: concurrency {', '.join(map(str, queued))} is above max-num-seqs {seqs} (args.max-num-seqs): "
                f"only {seqs} requests run at once, the rest wait: those cells measure a queue")


KNOWN_FILE = Path(str(resources.files("speedmatrix") / "data" / "engine_known.yaml"))


def known_broken(distribution: str | None, version: str | None, method: str | None,
                 architectures: list[str]) -> dict[str, Any] | None:
    """The measured entry (data/engine_known.yaml) saying this release serves this method wrongly for this target."""
    import yaml

    for entry in yaml.safe_load(KNOWN_FILE.read_text()) or []:
        if (entry["distribution"] == distribution and version in entry["versions"] and entry["method"] == method
                and (entry["targets"] == "any" or set(entry["targets"]) & set(architectures))):
            return entry
    return None


def _method_findings(exp: Experiment, srv: ServerConfig, ans: dict[str, Any], models_dir, out: Findings) -> None:
    method = (srv.speculative or {}).get("method")
    if not method:
        return
    arch = (model_config(exp, srv.model, models_dir) or {}).get("architectures") or []
    entry = known_broken(ans.get("vllm_distribution"), ans.get("vllm_version"), method, arch)
    if entry:
        out.errors.append(
            f"{exp.path}: server config {srv.id!r}, key 'speculative.method': {method} on "
            f"{entry['distribution']} {ans.get('vllm_version')}"
            + (f" with a {'/'.join(arch)} target" if entry["targets"] != "any" else "")
            + f" is not served correctly: {' '.join(entry['what'].split())} (measured: {entry['evidence']}); "
            "use another method or another release")


def _device_findings(exp: Experiment, ans: dict[str, Any], tgt: Target, gpus_here: int | None,
                     out: Findings) -> None:
    accel = ans.get("cuda") or ans.get("hip")
    served = f"{ans.get('vllm_distribution')} {ans.get('vllm_version')} ({tgt.where})"
    if exp.runtime["device"] == "gpu" and not accel:
        how = ("give runtime.command (the vLLM that serves on your GPUs: its Python, or `vllm serve` of its "
               "environment) or a container image (docs/your-model.md)"
               if exp.runtime["kind"] == "local" and not exp.runtime.get("command") else
               "serve it with a CUDA (or ROCm) build of vLLM")
        out.errors.append(f"{exp.path}: key 'runtime.device' is gpu, but the runtime that serves it, {served}, has a "
                          f"torch without CUDA or ROCm (it serves on the CPU): {how}")
    if exp.runtime["device"] == "gpu" and gpus_here is not None:
        for srv in exp.servers:
            if srv.parallel_size > gpus_here:
                out.errors.append(
                    f"{exp.path}: server config {srv.id!r}: tensor x pipeline parallel is {srv.parallel_size} GPUs "
                    f"and this run can give {gpus_here} (config 'gpus', else the GPUs NVML counts here)")


def model_findings(exp: Experiment, out: Findings) -> None:
    """Hub models: a repository or revision that does not exist is an error, asked of the Hub (nothing downloaded);
    offline, a model not in the cache is not checked, and said so."""
    hub = {name: m for name, m in exp.models.items() if "repo" in m}
    if not hub:
        return
    from huggingface_hub import HfApi, constants, errors, try_to_load_from_cache

    for name, m in hub.items():
        where = f"{exp.path}: key 'models.{name}'"
        rev = m.get("revision")
        try:
            cached = isinstance(try_to_load_from_cache(m["repo"], "config.json", revision=rev), str)
        except Exception:
            cached = False
        if cached:
            continue
        if constants.HF_HUB_OFFLINE:
            out.skipped.append(f"{where}: {m['repo']} at {rev}: not checked, offline (HF_HUB_OFFLINE=1) and not in "
                               f"the Hugging Face cache ({constants.HF_HUB_CACHE}): the run's download will fail "
                               "unless the cache is filled first")
            continue
        try:
            HfApi().model_info(m["repo"], revision=rev, timeout=10)
        except errors.GatedRepoError:
            out.warnings.append(f"{where}: {m['repo']} is gated: the download needs HF_TOKEN with access to it")
        except errors.RepositoryNotFoundError:
            out.errors.append(f"{where}: no repository {m['repo']!r} on the Hub (or it is private and HF_TOKEN "
                              "may not read it): check the name")
        except errors.RevisionNotFoundError:
            out.errors.append(f"{where}: {m['repo']} has no revision {rev!r} (a commit sha, branch or tag)")
        except Exception as e:  # no network, a proxy: not known here
            out.skipped.append(f"{where}: {m['repo']}: the Hub could not be asked ({type(e).__name__}): not checked")


def check(exp: Experiment, models_dir: str | Path, gpus_here: int | None = None) -> Findings:
    """Everything above, for every server config of ``exp``. ``gpus_here``: the GPUs this run can give one
    server (None where that is not known here: a cluster's nodes)."""
    out = Findings()
    model_findings(exp, out)
    tgt = target(exp)
    if isinstance(tgt, str):
        out.skipped.append(f"{exp.path}: {tgt}")
        answer = None
    else:
        try:
            answer, out.cached = ask(tgt, {s.id: request_of(s) for s in exp.servers}, cache_dir())
        except EngineCheckError as e:
            out.skipped.append(f"{exp.path}: {e}")
            answer = None
    if answer is None:
        for srv in exp.servers:  # the model's own limit still applies
            _length_findings(exp, srv, {}, models_dir, out)
        return out
    out.checked_by = f"{answer.get('vllm_distribution')} {answer.get('vllm_version')} in {tgt.where}"
    _device_findings(exp, answer, tgt, gpus_here, out)
    for srv in exp.servers:
        ans = answer["servers"][srv.id]
        for key, message in ans["errors"]:
            out.errors.append(f"{exp.path}: server config {srv.id!r}, key '{_flag_key(key)}': vLLM "
                              f"{answer.get('vllm_version')} says: {message}")
        _length_findings(exp, srv, ans, models_dir, out)
        _method_findings(exp, srv, answer, models_dir, out)
    return out
