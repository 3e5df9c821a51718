"""Speculative acceptance of the trained MTP drafter under sampling, from the server's counters.

Against an MTP server of tiny-cpu-trained's mtp2 config started by hand on port 18777 (the argv of its
launch.json, port fixed): 8 requests of 400 characters of the package's prose, 128 tokens each, EOS
ignored, per setting; acceptance = the change of vllm:spec_decode_num_accepted_tokens_total over
vllm:spec_decode_num_draft_tokens_total. Eight requests are few: a repeat of one setting moved 0.23 -> 0.14.
"""
import concurrent.futures as cf
import re

import requests

U = "http://127.0.0.1:18777"
def counters():
    t = requests.get(U + "/metrics").text
    def g(n):
        return sum(float(m.group(1)) for m in re.finditer(rf"^{n}\{{[^}}]*\}} ([0-9.e+]+)$", t, re.M))
    return g("vllm:spec_decode_num_accepted_tokens_total"), g("vllm:spec_decode_num_draft_tokens_total")
prompts = [open("src/speedmatrix/data/corpus/prose.txt").read()[i*300:i*300+400] for i in range(8)]
def one(i, body):
    r = requests.post(U + "/v1/completions", json={"model": "tiny", "prompt": prompts[i], "max_tokens": 128,
                                                    "ignore_eos": True, **body})
    return r.status_code
SETTINGS = [
    ("greedy c1", {"temperature": 0}, 1),
    ("t0.7 seeded c1", {"temperature": 0.7, "seed": 0}, 1),
    ("t0.7 unseeded c1", {"temperature": 0.7}, 1),
    ("t0.7 unseeded c4", {"temperature": 0.7}, 4),
    ("t0.7 seeded c4", {"temperature": 0.7, "seed": 0}, 4),
    ("t0.7 top_p0.95 c1", {"temperature": 0.7, "top_p": 0.95}, 1),
    ("t0.7 top_p0.95 c4", {"temperature": 0.7, "top_p": 0.95}, 4),
    ("t0.3 c1", {"temperature": 0.3}, 1),
    ("t1.0 c1", {"temperature": 1.0}, 1),
    ("t0.7 top_p0.95 seeded c1", {"temperature": 0.7, "top_p": 0.95, "seed": 0}, 1),
    ("t0.7 top_p0.95 seeded c4", {"temperature": 0.7, "top_p": 0.95, "seed": 0}, 4),
]
for name, body, conc in SETTINGS:
    a0, d0 = counters()
    with cf.ThreadPoolExecutor(conc) as ex:
        codes = list(ex.map(one, range(8), [body] * 8))
    a1, d1 = counters()
    print(f"{name}: acceptance {(a1-a0)/(d1-d0):.3f} ({a1-a0:.0f}/{d1-d0:.0f}) codes {set(codes)}", flush=True)
