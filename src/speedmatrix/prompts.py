"""Prompts sized exactly in tokens, from the repository's corpus, reproducible from a seed.

The corpus is tokenized once by the server's own ``/tokenize`` (so the sizes
are the server's, not a guess), and each request gets ``context`` token ids:
a short per-request nonce (different first block, so the prefix cache never
serves one request's prompt to another) followed by a window of the corpus
at a seeded offset.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from . import corpus

NONCE_TOKENS = 8


@dataclass
class PromptSource:
    corpus_ids: list[int]
    seed: int = 0

    def prompt(self, index: int, context: int, salt: str = "") -> list[int]:
        if context < 1:
            raise ValueError("context must be at least 1 token")
        rng = random.Random(f"{self.seed}:{salt}:{index}")
        ids = self.corpus_ids
        nonce = [ids[rng.randrange(len(ids))] for _ in range(min(NONCE_TOKENS, context))]
        rest = context - len(nonce)
        start = rng.randrange(len(ids))
        window = [ids[(start + k) % len(ids)] for k in range(rest)]
        return nonce + window


async def from_server(session, base_url: str, model: str, seed: int = 0, kind: str = "prose") -> PromptSource:
    """Tokenize the corpus with the server's own tokenizer (vLLM's ``/tokenize``)."""
    payload = {"model": model, "prompt": corpus.text(kind), "add_special_tokens": False}
    async with session.post(f"{base_url}/tokenize", json=payload) as resp:
        resp.raise_for_status()
        body = await resp.json()
    ids = body["tokens"]
    if len(ids) < 64:
        raise RuntimeError(f"{base_url}/tokenize returned only {len(ids)} tokens for the corpus")
    return PromptSource(corpus_ids=ids, seed=seed)
