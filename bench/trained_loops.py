#!/usr/bin/env python3
"""How often the trained tiny target loops, greedy and sampled: the evidence for what the default run does.

    .venv/bin/python bench/trained_loops.py [--prompts 24] [--tokens 256] [--out bench/results/trained_loops.json]

Prompts as the cells cut them: ``--prompts`` windows of 128 tokens from the package's prose and code corpora
(speedmatrix.measure.corpus), tokenized by the shipped pair's tokenizer. For each decoding setting (greedy; sampling
at temperatures 0.7 and 1.0 with top_p 0.95, seed = the prompt's index) the shipped target generates
``--tokens`` tokens with transformers (fp32, no EOS stop, as the cells' ``ignore_eos`` runs). The loop
detector the loop stage uses (speedmatrix.measure.loops.detect) judges each text, with its default thresholds and
with SHORT ones sized for a few hundred tokens; the token-level test (loops.detect_tokens) finds a periodic
tail of 4+ repeats covering 32+ tokens, with its onset. No vLLM: the model's own behaviour.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from speedmatrix.measure import corpus, loops  # noqa: E402
from speedmatrix.provision import training  # noqa: E402

SETTINGS = [("greedy", {}), ("t0.7", {"temperature": 0.7, "top_p": 0.95}),
            ("t1.0", {"temperature": 1.0, "top_p": 0.95})]
# the detector's thresholds are sized for outputs of thousands of tokens; the tiny default's are a few hundred
SHORT = {"looped_min_coverage_chars": 256, "suspected_min_coverage_chars": 128}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--model", type=Path, default=training.SHIPPED / training.TARGET)
    ap.add_argument("--out", type=Path)
    ns = ap.parse_args(argv)

    import torch
    from tokenizers import Tokenizer
    from transformers import Gemma4ForCausalLM

    tok = Tokenizer.from_file(str(ns.model / "tokenizer.json"))
    model = Gemma4ForCausalLM.from_pretrained(ns.model, dtype=torch.float32).eval()
    ids = [i for k in corpus.KINDS for i in tok.encode(corpus.text(k)).ids]
    step = max(1, (len(ids) - 128) // ns.prompts)
    prompts = [ids[i * step:i * step + 128] for i in range(ns.prompts)]
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "model": str(ns.model), "prompts": ns.prompts, "prompt_tokens": 128, "tokens": ns.tokens,
           "thresholds": loops.DEFAULTS, "short_thresholds": SHORT, "machine": platform.machine(), "settings": {}}
    for name, sampling in SETTINGS:
        t0 = time.monotonic()
        verdicts = []
        for k, p in enumerate(prompts):
            torch.manual_seed(k)
            gen = model.generate(torch.tensor([p]), max_new_tokens=ns.tokens, min_new_tokens=ns.tokens,
                                 do_sample=bool(sampling), **sampling, pad_token_id=0)
            new = gen[0, len(p):].tolist()
            text = tok.decode(new, skip_special_tokens=False)
            v = loops.detect(text)
            short = loops.detect(text, **SHORT)
            # the token-level test: a periodic tail of 4 or more repeats covering 32+ tokens
            tail = loops.detect_tokens(new, min_repeats=4, min_coverage_tokens=32)
            verdicts.append({"looped": v.looped, "suspected": v.suspected, "onset_char": v.onset_char,
                             "looped_short": short.looped, "suspected_short": short.suspected,
                             "periodic_tail": tail["looped"],
                             "onset_token": tail["onset_token"] if tail["looped"] else None,
                             "period_tokens": tail["period_tokens"], "chars": len(text)})
        looped = [v for v in verdicts if v["looped"]]
        onsets = [v["onset_token"] for v in verdicts if v["onset_token"] is not None]
        out["settings"][name] = {
            "sampling": sampling or None,
            "looped": len(looped), "suspected": sum(v["suspected"] for v in verdicts), "of": len(verdicts),
            "periodic_tail": sum(v["periodic_tail"] for v in verdicts),
            "looped_short_thresholds": sum(v["looped_short"] for v in verdicts),
            "suspected_short_thresholds": sum(v["suspected_short"] for v in verdicts),
            "median_onset_token": statistics.median(onsets) if onsets else None,
            "median_chars": statistics.median(v["chars"] for v in verdicts),
            "seconds": round(time.monotonic() - t0, 1),
        }
        print(name, json.dumps(out["settings"][name]), flush=True)
    if ns.out:
        ns.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
