"""Which speculative methods vLLM for the CPU serves, for which target architectures, and whether greedy output
stays the target's.

For two tiny targets with the shipped tokenizer (the Gemma-4 architecture of the default's model and Llama, four
layers each), every
method vLLM names for a drafter of one's own (EAGLE, EAGLE-3, a draft model) and the ones without (ngram), plus MTP
with the default's Gemma-4 drafter: a server is started with random weights (`--load-format dummy`: vLLM's own
initialisation, the same for every start, for the target and its drafter alike: what is measured is whether the
method is served, not its acceptance), greedy prompts are sent, and each method's outputs are compared with the
same target's without speculation. A random drafter proposes tokens the target rarely accepts, so an output that
differs from the target's is a method that does not keep the target's output there.

    python3 bench/spec_methods_cpu.py --out docs/results/spec-methods-cpu/results.json

Each server: its flags as the default experiment's (enforce-eager, max-model-len 2048, 160 KV blocks, no chunked
prefill), 8 prompts from the repository's prose corpus (128 tokens) x 48 greedy tokens, one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "src/speedmatrix/data/models"
PROMPTS = 8
MAX_TOKENS = 48


def _write(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (folder / f).write_bytes((SHIPPED / "tiny-gemma4-trained" / f).read_bytes())
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def models(root: Path) -> dict[str, Path]:
    """The targets and drafters, as configs (their weights are vLLM's dummy initialisation)."""
    # four layers (the shipped target has two): EAGLE-3 reads the target's hidden states at three layers, by
    # default layers 2, L/2 and L-3, which a two-layer target does not have
    shipped = json.loads((SHIPPED / "tiny-gemma4-trained/config.json").read_text())
    gemma = {**shipped, "num_hidden_layers": 4, "layer_types": shipped["layer_types"] * 2}
    h, vocab = gemma["hidden_size"], gemma["vocab_size"]
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h, "intermediate_size": 512,
             "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
             "vocab_size": vocab, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "bos_token_id": 2,
             "eos_token_id": 1, "pad_token_id": 0, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
    head = {**llama, "num_hidden_layers": 1, "tie_word_embeddings": False}
    return {
        "gemma4": _write(root / "gemma4", gemma),
        "llama": _write(root / "llama", llama),
        "eagle": _write(root / "eagle", {**head, "architectures": ["EagleLlamaForCausalLM"]}),
        "eagle3": _write(root / "eagle3", {**head, "architectures": ["LlamaForCausalLMEagle3"],
                                           "draft_vocab_size": vocab}),
        "draft-gemma4": _write(root / "draft-gemma4", {**gemma, "num_hidden_layers": 1,
                                                       "layer_types": ["full_attention"]}),
        "draft-llama": _write(root / "draft-llama", {**llama, "num_hidden_layers": 1}),
        "mtp": SHIPPED / "tiny-gemma4-trained-mtp",
    }


def cases(m: dict[str, Path]) -> list[tuple[str, str, dict | None]]:
    out = []
    for target, draft in (("gemma4", "draft-gemma4"), ("llama", "draft-llama")):
        out += [(target, "none", None),
                (target, "ngram", {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}),
                (target, "eagle", {"method": "eagle", "model": str(m["eagle"]), "num_speculative_tokens": 2}),
                (target, "eagle3", {"method": "eagle3", "model": str(m["eagle3"]), "num_speculative_tokens": 2}),
                (target, "draft_model", {"method": "draft_model", "model": str(m[draft]),
                                         "num_speculative_tokens": 2})]
    out.insert(1, ("gemma4", "mtp", {"model": str(m["mtp"]), "num_speculative_tokens": 2}))
    return out


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def _counter(metrics: str, name: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(metrics):
        for s in fam.samples:
            if s.name == name:
                return s.value
    return None


def prompts() -> list[str]:
    text = (REPO / "src/speedmatrix/data/corpus/prose.txt").read_text()
    return [text[i * 700:i * 700 + 500] for i in range(PROMPTS)]


def serve(target: Path, spec: dict | None, log: Path) -> dict:
    port = _port()
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--port", str(port),
            "--load-format", "dummy", "--enforce-eager", "--max-model-len", "2048", "--gpu-memory-utilization", "0.2",
            "--num-gpu-blocks-override", "160", "--max-num-batched-tokens", "2048", "--no-enable-chunked-prefill",
            "--served-model-name", "t"]
    if spec:
        argv += ["--speculative-config", json.dumps(spec)]
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "auto"}
    t0 = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    result: dict = {"started": False}
    try:
        while time.monotonic() - t0 < 600:
            if proc.poll() is not None:
                lines = [ln for ln in log.read_text(errors="replace").splitlines() if "Error" in ln]
                result["error"] = (lines[-1] if lines else f"exit {proc.returncode}")[-400:]
                return result
            try:
                _get(f"http://127.0.0.1:{port}/health", 2)
                break
            except OSError:
                time.sleep(1)
        else:
            result["error"] = "not up in 600 s"
            return result
        result.update(started=True, start_s=round(time.monotonic() - t0, 1))
        outs = []
        for p in prompts():
            try:
                r = _post(f"http://127.0.0.1:{port}/v1/completions",
                          {"model": "t", "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0,
                           "ignore_eos": True})
                outs.append(r["choices"][0]["text"])
            except OSError as e:
                # the engine's own reason, from its log: the last exception line
                why = [ln.split("] ", 1)[-1] for ln in log.read_text(errors="replace").splitlines()
                       if "Error: " in ln and "EngineDeadError" not in ln]
                result["error"] = f"request failed: {e}" + (f"; the engine: {why[-1].strip()[:300]}" if why else "")
                break
        result["outputs"] = outs
        metrics = _get(f"http://127.0.0.1:{port}/metrics")
        for key, name in (("drafts", "vllm:spec_decode_num_drafts_total"),
                          ("draft_tokens", "vllm:spec_decode_num_draft_tokens_total"),
                          ("accepted_tokens", "vllm:spec_decode_num_accepted_tokens_total")):
            result[key] = _counter(metrics, name)
        return result
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "docs/results/spec-methods-cpu/results.json")
    ns = ap.parse_args()
    from importlib.metadata import version

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        m = models(Path(tmp) / "models")
        baseline: dict[str, list[str]] = {}
        for target, method, spec in cases(m):
            r = serve(m[target], spec, Path(tmp) / f"{target}-{method}.log")
            outs = r.pop("outputs", None)
            if method == "none":
                baseline[target] = outs or []
            same = (sum(a == b for a, b in zip(outs, baseline.get(target, []))) if outs is not None else None)
            rows.append({"target": target, "method": method, **r, "outputs_equal_to_target": same,
                         "outputs": len(outs) if outs is not None else 0})
            print(json.dumps(rows[-1]), flush=True)
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps({
        "what": "speculative methods on vLLM for the CPU with random weights (bench/spec_methods_cpu.py)",
        "vllm_distribution": "vllm-cpu", "vllm_version": version("vllm-cpu"), "prompts": PROMPTS,
        "max_tokens": MAX_TOKENS, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
