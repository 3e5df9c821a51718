"""Experiments: load, validate (before anything starts), and expand into server configs and cells.

A *server config* is everything that needs a server restart (model, drafter,
flags, environment). A *cell* is what the client varies against a running
server (workload, context, concurrency, output cap, duration).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SERVER_KEYS = ("model", "served_model_name", "host", "port", "args", "env", "speculative", "startup_timeout_s")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_STARTUP_TIMEOUT_S = 900.0


class ConfigError(ValueError):
    """Bad input: the message names the file and the key, and says what to do."""


SCHEMA_DIR = Path(__file__).resolve().parents[2] / "config" / "schemas"


def schema_path(name: str) -> Path:
    """The JSON schemas live in the workflow's config/schemas (the package is installed editable from it)."""
    return SCHEMA_DIR / f"{name}.schema.yaml"


def _key_path(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _specific(err: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """For "one block or a list of blocks" (oneOf), the error of the branch that matches the value's type."""
    if err.validator == "oneOf" and err.context:
        same_type = [e for e in err.context
                     if isinstance(err.instance, list) == (e.schema_path and e.schema_path[0] == 1)]
        return _specific(jsonschema.exceptions.best_match(same_type or err.context))
    return err


def validate(data: Any, schema_name: str, source: str) -> None:
    schema_path_name = schema_name
    schema = yaml.safe_load(schema_path(schema_name).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted((_specific(e) for e in validator.iter_errors(data)), key=lambda e: list(e.absolute_path))
    if not errors:
        return
    lines = []
    for err in errors[:10]:
        where = _key_path(err.absolute_path)
        if err.validator == "additionalProperties":
            allowed = sorted(err.schema.get("properties", {}))
            extra = sorted(set(err.instance) - set(allowed)) if isinstance(err.instance, dict) else []
            for key in extra:
                full = f"{where}.{key}" if where != "(top level)" else key
                hint = f" (allowed here: {', '.join(allowed)})" if allowed else ""
                lines.append(f"{source}: key '{full}': unknown key{hint}")
            if extra:
                continue
        lines.append(f"{source}: key '{where}': {err.message}")
    raise ConfigError(
        "invalid configuration (checked against "
        f"{schema_path_name}.schema.yaml before anything starts):\n  " + "\n  ".join(lines)
    )


def available(experiments_dir: str | Path) -> list[str]:
    return sorted(p.stem for p in Path(experiments_dir).glob("*.yaml"))


@dataclass
class ServerConfig:
    id: str
    model: str
    served_model_name: str
    host: str
    port: int
    args: dict[str, Any]
    env: dict[str, str]
    speculative: dict[str, Any] | None
    startup_timeout_s: float

    device: str = "gpu"

    @property
    def gpus(self) -> int:
        """GPUs one server of this config needs (0 on a CPU runtime)."""
        if self.device == "cpu":
            return 0
        tp = int(self.args.get("tensor-parallel-size", 1))
        pp = int(self.args.get("pipeline-parallel-size", 1))
        return tp * pp

    @property
    def spec_tokens(self) -> int:
        return int(self.speculative["num_speculative_tokens"]) if self.speculative else 0


WORKLOADS = ("prefill", "latency", "capacity", "prefix_cache", "decode")
# a cell id: <workload>-ctx<N>[-c<M>][-share<P>][-<corpus>]; rules/common.smk constrains the wildcard to it
CELL_KEY_PATTERN = r"ctx[0-9]+(-c[0-9]+)?(-share[0-9.]+)?(-code)?"
CELL_ID_PATTERN = r"(prefill|latency|capacity|prefix_cache|decode)-" + CELL_KEY_PATTERN


def _share_label(fraction: float) -> str:
    """0.875 -> '87.5', 0.25 -> '25' (percent, no trailing zeros)."""
    return f"{fraction * 100:.4f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class Cell:
    server_id: str
    workload: str
    context_tokens: int
    concurrency: int
    max_tokens: int
    duration_s: float | None = None
    requests: int = 1  # prefill, capacity, latency, prefix_cache: how many requests the cell sends
    shared_prefix: float | None = None  # prefix_cache: fraction of the context shared by every request
    corpus: str = "prose"  # the repository text prompts are cut from (corpus.KINDS)

    @property
    def id(self) -> str:
        out = f"{self.workload}-ctx{self.context_tokens}"
        if self.workload not in ("prefill", "latency"):
            out += f"-c{self.concurrency}"
        if self.shared_prefix is not None:
            out += f"-share{_share_label(self.shared_prefix)}"
        if self.corpus != "prose":
            out += f"-{self.corpus}"
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "server_id": self.server_id,
            "cell_id": self.id,
            "workload": self.workload,
            "context_tokens": self.context_tokens,
            "concurrency": self.concurrency,
            "max_tokens": self.max_tokens,
            "duration_s": self.duration_s,
            "requests": self.requests,
            "shared_prefix": self.shared_prefix,
            "corpus": self.corpus,
        }


def workload_blocks(workloads: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each workload is one block or a list of blocks (e.g. decode on prose and on code)."""
    out = []
    for kind in WORKLOADS:
        blocks = workloads.get(kind)
        if blocks is None:
            continue
        for block in blocks if isinstance(blocks, list) else [blocks]:
            out.append((kind, block))
    return out


def expand_block(server_id: str, kind: str, b: dict[str, Any]) -> list[Cell]:
    corpus = b.get("corpus", "prose")
    if kind == "prefill":
        return [Cell(server_id, kind, ctx, 1, 1, requests=b.get("repeats", 3), corpus=corpus)
                for ctx in b["contexts"]]
    if kind == "latency":
        return [Cell(server_id, kind, ctx, 1, b["max_tokens"], requests=b["requests"], corpus=corpus)
                for ctx in b["contexts"]]
    if kind == "capacity":
        return [Cell(server_id, kind, ctx, c, b["max_tokens"], requests=b["requests"], corpus=corpus)
                for ctx in b["contexts"] for c in b["concurrency"]]
    if kind == "prefix_cache":
        return [Cell(server_id, kind, ctx, c, b["max_tokens"], requests=b["requests"], shared_prefix=float(share),
                     corpus=corpus)
                for share in b["shared_prefix"] for ctx in b["contexts"] for c in b["concurrency"]]
    if kind == "decode":
        return [Cell(server_id, kind, ctx, c, b["max_tokens"], float(b["duration_s"]), corpus=corpus)
                for ctx in b["contexts"] for c in b["concurrency"]]
    raise ValueError(f"unknown workload {kind!r}")


@dataclass
class Experiment:
    name: str
    path: Path
    raw: dict[str, Any]
    servers: list[ServerConfig] = field(default_factory=list)

    @property
    def models(self) -> dict[str, dict[str, Any]]:
        return self.raw["models"]

    @property
    def client(self) -> dict[str, Any]:
        return self.raw.get("client", {})

    @property
    def loops(self) -> dict[str, Any]:
        return self.raw.get("loops", {})

    def server(self, server_id: str) -> ServerConfig:
        for s in self.servers:
            if s.id == server_id:
                return s
        raise KeyError(f"{self.path}: no server config with id {server_id!r}")

    def cells(self, server_id: str | None = None) -> list[Cell]:
        out: list[Cell] = []
        for srv in self.servers:
            if server_id is not None and srv.id != server_id:
                continue
            for kind, block in workload_blocks(self.raw["workloads"]):
                out.extend(expand_block(srv.id, kind, block))
        return out

    def cell(self, server_id: str, cell_id: str) -> Cell:
        for c in self.cells(server_id):
            if c.id == cell_id:
                return c
        raise KeyError(f"{self.path}: server config {server_id!r} has no cell {cell_id!r}")


def _check_references(exp: dict[str, Any], source: str) -> None:
    models = exp["models"]
    problems = []
    ids = [s["id"] for s in exp["servers"]]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        problems.append(f"{source}: key 'servers': duplicate id(s) {', '.join(dup)}")
    for i, srv in enumerate(exp["servers"]):
        merged = {**exp["server"], **srv}
        if merged.get("model") not in models:
            problems.append(
                f"{source}: key 'servers[{i}].model': {merged.get('model')!r} is not a key of 'models' "
                f"(known: {', '.join(models)})"
            )
        spec = merged.get("speculative")
        if spec and spec["model"] not in models:
            problems.append(
                f"{source}: key 'servers[{i}].speculative.model': {spec['model']!r} is not a key of 'models'"
            )
    for kind, block in workload_blocks(exp["workloads"]):
        ids = [c.id for c in expand_block("x", kind, block)]
        if len(set(ids)) != len(ids):
            problems.append(f"{source}: key 'workloads.{kind}': repeated values give the same cell twice")
    seen = [c.id for kind, block in workload_blocks(exp["workloads"]) for c in expand_block("x", kind, block)]
    dup_cells = sorted({i for i in seen if seen.count(i) > 1})
    if dup_cells and not any("repeated values" in p for p in problems):
        problems.append(f"{source}: key 'workloads': two blocks give the same cells ({', '.join(dup_cells[:5])}); "
                        "give one of them another corpus or other contexts")
    from .models import PRESETS

    for name, m in models.items():
        if m["synthesize"] not in PRESETS:
            problems.append(
                f"{source}: key 'models.{name}.synthesize': unknown preset {m['synthesize']!r} "
                f"(known: {', '.join(sorted(PRESETS))})"
            )
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))


def load(name: str, experiments_dir: str | Path = "config/experiments") -> Experiment:
    path = Path(experiments_dir) / f"{name}.yaml"
    if not path.exists():
        names = available(experiments_dir)
        raise ConfigError(
            f"unknown experiment {name!r}: no file {path}. Available experiments: "
            f"{', '.join(names) if names else '(none)'}"
        )
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: an experiment must be a mapping of keys, got {type(raw).__name__}")
    validate(raw, "experiment", str(path))
    _check_references(raw, str(path))
    exp = Experiment(name=name, path=path, raw=raw)
    base = raw["server"]
    for srv in raw["servers"]:
        merged = copy.deepcopy(base)
        for key in SERVER_KEYS:
            if key in srv:
                if key in ("args", "env"):
                    merged[key] = {**merged.get(key, {}), **srv[key]}
                else:
                    merged[key] = copy.deepcopy(srv[key])
        exp.servers.append(
            ServerConfig(
                id=srv["id"],
                model=merged["model"],
                served_model_name=merged.get("served_model_name", merged["model"]),
                host=merged.get("host", DEFAULT_HOST),
                port=int(merged.get("port", 0)),
                args=merged.get("args", {}),
                env={k: str(v) for k, v in merged.get("env", {}).items()},
                speculative=merged.get("speculative"),
                startup_timeout_s=float(merged.get("startup_timeout_s", DEFAULT_STARTUP_TIMEOUT_S)),
                device=raw["runtime"].get("device", "gpu"),
            )
        )
    return exp
