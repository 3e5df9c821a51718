"""How long `speedmatrix validate` takes on a six-config experiment: cold (vLLM's checks run in the runtime's Python:
its import is most of it) and warm (its answers come from the cache under the runtime's pin).

The experiment is the default's model on this checkout's vLLM for the CPU with six server configs (no speculation,
MTP at 2 and 4 tokens, ngram, and two max-num-seqs values) and a decode grid, so that every check runs: vLLM's
parser and speculative config, lengths, queues. Each run is a fresh `speedmatrix validate` process; the cache is a
folder of this script's (XDG_CACHE_HOME), emptied before each cold run.

    python3 bench/validate_time.py --runs 5 --out bench/results/validate_time.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SERVERS = [
    {"id": "base"},
    {"id": "mtp2", "speculative": {"model": "tiny-gemma4-trained-mtp", "num_speculative_tokens": 2}},
    {"id": "mtp4", "speculative": {"model": "tiny-gemma4-trained-mtp", "num_speculative_tokens": 4}},
    {"id": "ngram", "speculative": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 5}},
    {"id": "seqs16", "args": {"max-num-seqs": 16}},
    {"id": "seqs32", "args": {"max-num-seqs": 32}},
]


def experiment(folder: Path) -> Path:
    data = yaml.safe_load((REPO / "config/experiments/tiny-cpu.yaml").read_text())
    data["servers"] = SERVERS
    data["workloads"] = {"decode": {"contexts": [128, 512, 1024], "concurrency": [1, 4, 16, 64], "duration_s": 10,
                                    "max_tokens": 128}}
    for key in ("gates", "lossless"):
        data.pop(key, None)
    path = folder / "six-configs.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def once(path: Path, cache: Path) -> tuple[float, str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([str(REPO / ".venv/bin/speedmatrix"), "validate", str(path)], capture_output=True,
                          text=True, env=env, cwd=REPO)
    seconds = time.perf_counter() - t0
    if "checked by" not in proc.stdout:
        sys.exit(f"validate did not run vLLM's checks:\n{proc.stdout}{proc.stderr}")
    return seconds, proc.stdout


def spread(xs: list[float]) -> dict[str, float]:
    return {"min_s": round(min(xs), 3), "median_s": round(statistics.median(xs), 3), "max_s": round(max(xs), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/validate_time.json")
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = experiment(folder)
        cache = folder / "cache"
        cold, warm = [], []
        for _ in range(ns.runs):
            shutil.rmtree(cache, ignore_errors=True)
            cold.append(once(path, cache)[0])
            seconds, out = once(path, cache)
            if "(cached answer)" not in out:
                sys.exit(f"the second validate did not answer from the cache:\n{out}")
            warm.append(seconds)
    result = {
        "what": "speedmatrix validate of a six-config experiment (bench/validate_time.py), a fresh process each",
        "servers": [s["id"] for s in SERVERS], "runs": ns.runs,
        "cold": spread(cold), "warm": spread(warm), "cold_s": [round(x, 3) for x in cold],
        "warm_s": [round(x, 3) for x in warm],
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                    "processor": _cpu_model()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    ns.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("cold", "warm")}))
    return 0


def _cpu_model() -> str | None:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


if __name__ == "__main__":
    sys.exit(main())
