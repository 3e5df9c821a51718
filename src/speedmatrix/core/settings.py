"""Settings with their defaults in one place: the experiment schema.

Every default an experiment's keys have is declared once, as ``default:`` in
``data/schemas/experiment.schema.yaml``; :func:`apply_defaults` writes them into
a validated experiment when it loads (speedmatrix.plan.experiment), so the code reads
``cfg["key"]`` and never repeats a default in ``.get(key, default)``. The
client's settings become a typed object, :class:`ClientSettings`, built the same
way for the workflow (an experiment's ``client:``) and for ``speedmatrix
measure`` and ``speedmatrix agree`` (their options).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    import jsonschema


def schema_path(name: str) -> Path:
    """A JSON schema shipped in the package (data/schemas; the workflow's config/schemas links to it)."""
    return Path(str(resources.files("speedmatrix") / "data" / "schemas" / f"{name}.schema.yaml"))


@cache
def schema(name: str) -> dict[str, Any]:
    return yaml.safe_load(schema_path(name).read_text())


def _deref(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        ref = node["$ref"]
        if not ref.startswith("#/"):
            raise ValueError(f"schema: only local references are followed, not {ref!r}")
        target: Any = root
        for part in ref[2:].split("/"):
            target = target[part]
        node = target
    return node


def typed(data: Any, node: dict[str, Any], root: dict[str, Any] | None = None) -> Any:
    """Strings where the schema asks for an integer, a number or a boolean, converted in place (where they read as
    one): Snakemake's ``--config cluster={job_runtime_min: 5}`` gives a nested mapping's values as strings."""
    root = node if root is None else root
    node = _deref(node, root)
    if isinstance(data, dict):
        props = node.get("properties", {})
        for key, value in data.items():
            if key in props:
                data[key] = typed(value, props[key], root)
        return data
    if isinstance(data, str):
        kinds = node.get("type", [])
        kinds = [kinds] if isinstance(kinds, str) else kinds
        text = data.strip()
        if "boolean" in kinds and text.lower() in ("true", "false"):
            return text.lower() == "true"
        for kind, cast in (("integer", int), ("number", float)):
            if kind in kinds:
                try:
                    return cast(text)
                except ValueError:
                    pass
    return data


def apply_defaults(data: Any, node: dict[str, Any], root: dict[str, Any],
                   validator: jsonschema.protocols.Validator | None = None) -> Any:
    """Fill every absent key that has a ``default`` in ``node`` (a schema, or a part of ``root``), in
    place and recursively; where the schema says one of several shapes (``oneOf``/``anyOf``), the
    defaults of the shape ``data`` has. ``data`` must already be valid against ``node``."""
    node = _deref(node, root)
    if validator is None:  # one for the whole walk; imported here: reading settings needs no validator
        import jsonschema

        validator = jsonschema.Draft202012Validator(root)
    if isinstance(data, dict):
        props = node.get("properties", {})
        for key, sub in props.items():
            sub_schema = _deref(sub, root)
            if key not in data and "default" in sub_schema:
                data[key] = copy.deepcopy(sub_schema["default"])
            if key in data:
                apply_defaults(data[key], sub_schema, root, validator)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            for key, value in data.items():
                if key not in props:
                    apply_defaults(value, extra, root, validator)
    elif isinstance(data, list) and isinstance(node.get("items"), dict):
        for item in data:
            apply_defaults(item, node["items"], root, validator)
    branches = node.get("oneOf", []) + node.get("anyOf", [])
    for branch in branches:
        if validator.evolve(schema=branch).is_valid(data):
            apply_defaults(data, branch, root, validator)
            break
    return data


def section_defaults(section: str, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """``given`` (keys of the experiment's top-level ``section``) with the section's defaults filled."""
    root = schema("experiment")
    return apply_defaults(copy.deepcopy(given or {}), root["properties"][section], root)


def defaults_of(definition: str, block: dict[str, Any]) -> dict[str, Any]:
    """``block`` with the defaults of the schema's ``$defs/<definition>`` filled (a workload kind's block,
    ``sampling``): what ``speedmatrix measure`` builds from its options, as an experiment would have it."""
    root = schema("experiment")
    return apply_defaults(copy.deepcopy(block), root["$defs"][definition], root)


@dataclass(frozen=True)
class ClientSettings:
    """How the client measures (an experiment's ``client:``; its keys and defaults: the schema)."""

    stall_timeout_s: float
    seed: int
    ignore_eos: bool
    stop_looping: bool
    api: str
    prompt_format: str
    usage_per_chunk: str | bool
    busy_wait_s: float
    metrics_interval_s: float
    max_stall_share: float
    max_loop_lag_p95_ms: float
    max_cpu_share: float
    cell_timeout_s: float | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @classmethod
    def from_config(cls, given: dict[str, Any] | None = None) -> ClientSettings:
        """From ``client:`` keys (valid against the schema), the absent ones at their defaults."""
        return cls(**section_defaults("client", given))

    def as_dict(self) -> dict[str, Any]:
        """Every setting, for a result's provenance and for what a measurement depends on."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> ClientSettings:
        return dataclasses.replace(self, **changes)
