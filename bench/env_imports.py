#!/usr/bin/env python3
"""Import every module of a vLLM environment's kernel, warm-up, attention, sampling and speculative-decoding
packages on a machine without a GPU: a package pinned at a version its neighbours do not work with fails at import
(vLLM 0.26.0 beside quack-kernels 0.5.0: "module 'cutlass.cute.core' has no attribute 'ThrMma'", which stopped every
server start on an H200), while a module that needs the GPU itself fails for want of a driver or CUDA extension.
Run it with the environment's Python, before carrying the environment to a GPU host:

    uv venv -p python3.12 /tmp/env && VIRTUAL_ENV=/tmp/env uv pip install --no-deps -r <(grep -v '^#' LOCK)
    /tmp/env/bin/python bench/env_imports.py > bench/results/<name>-cpu-imports.txt

Prints each failure with the class of its cause (no GPU, or something else to look at) and exits 1 when any
failure is of the second class.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import sys

PACKAGES = ("vllm.model_executor.kernels", "vllm.model_executor.warmup", "vllm.v1.attention.backends",
            "vllm.v1.sample", "vllm.v1.spec_decode")
# lazily imported kernel libraries vLLM calls at start-up (the warm-up's ll_bf16 GEMM imports quack's helpers)
ALSO = ("quack", "quack.compile_utils", "flashinfer", "tilelang", "tokenspeed_mla", "humming", "xgrammar")
# what a module that needs the GPU itself says on a machine without one
NO_GPU = ("NVIDIA driver", "CUDA flash attention extensions", "'_C' object has no attribute", "PassConfigKey",
          "compile_flash_attn_varlen_func_from_specs", "libcuda", "CUDA driver")


def main() -> int:
    failed = {}
    names = list(ALSO)
    for pkg in PACKAGES:
        names += [m.name for m in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + ".")]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # every failure is reported, none stops the scan
            failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    versions = {p: importlib.metadata.version(p) for p in ("vllm", "torch", "quack-kernels", "nvidia-cutlass-dsl",
                                                           "flashinfer-python")}
    print(f"# {sys.executable}: {', '.join(f'{k} {v}' for k, v in versions.items())}")
    print(f"{len(names)} modules imported, {len(failed)} failed")
    other = 0
    for name, why in failed.items():
        gpu = any(s in why for s in NO_GPU)
        other += not gpu
        print(f"  {'no GPU' if gpu else 'LOOK  '}  {name}: {why}")
    return 1 if other else 0


if __name__ == "__main__":
    sys.exit(main())
