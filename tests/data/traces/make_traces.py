"""Writes the small traces of this folder (run from the repository root: python tests/data/traces/make_traces.py).

They are written for the tests and the default experiment, in the published formats, not taken from a real
service: a Mooncake-format trace whose requests share prefixes the way chat traffic does (three system prompts
of two 512-token blocks, conversations that come back with their history and a new turn) and an Azure-format
trace of the same arrivals without sharing. Seeded: running it again writes the same files.
"""

import csv
import json
import random
from datetime import datetime, timedelta
from pathlib import Path

HERE = Path(__file__).parent


def mooncake(n: int = 40, span_s: float = 16.0, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    roots = [[10 * r + 1, 10 * r + 2] for r in range(3)]  # three system prompts, two blocks each
    next_id, conversations, out = 100, [], []
    t = 0.0
    for _ in range(n):
        t += rng.expovariate(n / span_s)
        if conversations and rng.random() < 0.5:  # a conversation comes back: its history, then a new turn
            conv = rng.choice(conversations)
        else:
            conv = list(rng.choice(roots))
            conversations.append(conv)
        conv.extend(range(next_id, next_id + rng.randint(1, 2)))  # the new turn's blocks
        next_id += 2
        ids = list(conv[:8])  # at most 8 blocks (4,096 tokens)
        length = 512 * (len(ids) - 1) + rng.randint(64, 512)  # the last block partly filled
        out.append({"timestamp": int(t * 1000), "input_length": length, "output_length": rng.randint(16, 400),
                    "hash_ids": ids})
    return out


def main() -> None:
    rows = mooncake()
    (HERE / "mooncake-small.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    start = datetime(2023, 11, 16, 18, 15, 46)
    with open(HERE / "azure-small.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for r in rows:
            stamp = start + timedelta(milliseconds=r["timestamp"])
            w.writerow([stamp.strftime("%Y-%m-%d %H:%M:%S.%f") + "0", r["input_length"], r["output_length"]])


if __name__ == "__main__":
    main()
