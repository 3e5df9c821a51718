"""Prompts sized exactly in tokens, from the repository's corpus, reproducible from a seed.

The corpus and an instruction are tokenized once by the server's own
``/tokenize`` (so the sizes are the server's, not a guess) and every request
is sent as exactly ``context`` token ids:

    [nonce][window of the corpus at a seeded offset][instruction]

* the *nonce* (8 tokens drawn from the seed, the cell, the request index and a
  per-measurement value recorded in the result) makes the first KV block of
  every prompt unique, so the prefix cache never serves one request's prompt
  to another, nor a rerun's prompt from an earlier run on the same server;
* the *instruction* asks for a long answer ("continue at length" for prose,
  "explain and rewrite" for code), so output length comes from the model
  rather than from ``ignore_eos`` (which stays off by default).

For prefix-cache cells a shared part (its own nonce and window, the same for
every request of the cell) comes first and the per-request part follows.

By default a prompt is sent as *text*, as users and ``vllm bench serve``
send it, so the server's tokenization is part of what is measured: the ids
are turned into text with the server's ``/detokenize`` and the text is
checked with ``/tokenize`` to be exactly ``context`` tokens as the
completions endpoint will see it, the model's special tokens (a BOS) included
(cut or extended and checked again if the round trip merged tokens
differently). A prompt
that cannot be made exact is sent as its token ids instead, and the request
records it (``prompt_format``). ``prompt_format: token_ids`` sends ids
throughout (engine-side figures, without the server's tokenization).
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import CellError
from . import corpus

NONCE_TOKENS = 8

INSTRUCTIONS = {
    "prose": "\n\nContinue the text above at length, in the same style, for several pages:\n\n",
    "code": "\n\nExplain the code above step by step, then rewrite all of it with full comments and tests:\n\n",
}


@dataclass
class PromptSource:
    corpus_ids: list[int]
    instruction_ids: list[int]
    seed: int = 0
    nonce: str = ""  # per measurement: recorded in the result, so prompts can be rebuilt

    def _rng(self, *parts: object) -> random.Random:
        return random.Random(":".join(str(p) for p in (self.seed, self.nonce, *parts)))

    def _window(self, rng: random.Random, n: int) -> list[int]:
        ids = self.corpus_ids
        start = rng.randrange(len(ids))
        return [ids[(start + k) % len(ids)] for k in range(n)]

    def _unique(self, rng: random.Random, n: int) -> list[int]:
        """n tokens that start with a nonce: no cached prefix can match them."""
        ids = self.corpus_ids
        nonce = [ids[rng.randrange(len(ids))] for _ in range(min(NONCE_TOKENS, n))]
        return nonce + self._window(rng, n - len(nonce))

    def prompt(self, index: int, context: int, salt: str = "") -> list[int]:
        """``context`` token ids: a unique start, corpus text, the instruction (cut to fit)."""
        if context < 1:
            raise ValueError("context must be at least 1 token")
        tail = self.instruction_ids[: max(0, context - NONCE_TOKENS)]
        return self._unique(self._rng(salt, index), context - len(tail)) + tail

    def shared_prefix_prompt(self, index: int, context: int, shared: int, salt: str = "") -> list[int]:
        """``shared`` tokens the same for every index of ``salt``, then ``context - shared`` of this request's."""
        if not 0 < shared < context:
            raise ValueError(f"shared prefix must be between 0 and the context ({context}), got {shared}")
        prefix = self._unique(self._rng(salt, "shared-prefix"), shared)
        return prefix + self.prompt(index, context - shared, salt)


class Tagged(list):
    """A prompt's token ids with what its dataset record says of it (category, output cap), carried to the
    request it becomes."""

    category: str | None = None
    max_tokens: int | None = None


@dataclass
class DatasetSource:
    """Prompts from a dataset's records (speedmatrix.measure.datasets), tokenized by the server: request i gets a
    nonce and the ``i``-th record (seeded order, the same for every server config) among those that fit the
    context. Records too long for it are skipped, never cut (``skipped``)."""

    record_ids: list[list[int]]
    output_tokens: list[int | None]
    categories: list[str | None]
    corpus_ids: list[int]  # the nonce's and the aligner's filler tokens: the records' own
    seed: int = 0
    nonce: str = ""
    instruction_ids: tuple = ()
    turn_ids: list[list[list[int]]] = field(default_factory=list)  # each record's later user turns, tokenized

    def __post_init__(self) -> None:
        self.order = list(range(len(self.record_ids)))
        random.Random(f"{self.seed}:dataset-order").shuffle(self.order)
        self.skipped: dict[int, int] = {}

    def fitting(self, context: int) -> list[int]:
        fit = [k for k in self.order if len(self.record_ids[k]) + NONCE_TOKENS <= context]
        self.skipped[context] = len(self.order) - len(fit)
        if not fit:
            raise CellError(f"no prompt of the dataset fits a {context}-token context (with its {NONCE_TOKENS}-token "
                            f"nonce; the shortest has {min(map(len, self.record_ids))} tokens): raise the context")
        return fit

    def prompt(self, index: int, context: int, salt: str = "") -> Tagged:
        fit = self.fitting(context)
        k = fit[index % len(fit)]
        rng = random.Random(":".join(str(p) for p in (self.seed, self.nonce, salt, index)))
        out = Tagged([self.corpus_ids[rng.randrange(len(self.corpus_ids))] for _ in range(NONCE_TOKENS)]
                     + self.record_ids[k])
        out.category, out.max_tokens = self.categories[k], self.output_tokens[k]
        return out

    def shared_prefix_prompt(self, index: int, context: int, shared: int, salt: str = "") -> list[int]:
        raise CellError("a dataset's prompts share no prefix: prefix-cache cells use the built-in corpora")

    def conversation(self, index: int, context: int, salt: str = "") -> tuple[Tagged, list[list[int]]]:
        """Session ``index``'s opening prompt (as ``prompt`` picks it) and its record's later user turns."""
        fit = self.fitting(context)
        k = fit[index % len(fit)]
        return self.prompt(index, context, salt), list(self.turn_ids[k]) if self.turn_ids else []


async def from_dataset(session, base_url: str, model: str, records: list, seed: int = 0, nonce: str = "",
                       headers: dict[str, str] | None = None) -> DatasetSource:
    """Tokenize a dataset's prompts (and reference outputs, for their length) with the server's tokenizer."""
    aligner = TextAligner(session, base_url, model, headers)

    async def count(text: str | None) -> list[int] | None:
        return None if text is None else await aligner._tokenize(text, False)

    ids = await asyncio.gather(*(count(r.prompt) for r in records))
    outs = await asyncio.gather(*(count(r.output) for r in records))
    later = [list(await asyncio.gather(*(count(t) for t in getattr(r, "turns", ())))) for r in records]
    caps = [r.output_tokens if r.output_tokens is not None else (len(o) if o else None) for r, o in zip(records, outs)]
    filler = [t for x in ids[:64] for t in x][:4096]
    return DatasetSource(record_ids=list(ids), output_tokens=caps, categories=[r.category for r in records],
                         corpus_ids=filler, seed=seed, nonce=nonce, turn_ids=later)


async def answer_json(resp, what: str, *fields: str) -> dict[str, Any]:
    """A JSON answer of the server with these fields, or a CellError that names what was wrong with it."""
    if resp.status != 200:
        raise CellError(f"{what} answered HTTP {resp.status}: {(await resp.text())[:200]}")
    if resp.content_type != "application/json":
        raise CellError(f"{what} answered {resp.content_type or 'no content type'}, not application/json: "
                        f"{(await resp.text())[:200]!r}")
    try:
        body = json.loads(await resp.text())
    except ValueError:
        raise CellError(f"{what} answered a body that is not JSON: {(await resp.text())[:200]!r}") from None
    missing = [f for f in fields if not isinstance(body, dict) or f not in body]
    if missing:
        raise CellError(f"{what} answered JSON without {', '.join(missing)}: {str(body)[:200]}")
    return body


async def from_server(session, base_url: str, model: str, seed: int = 0, kind: str = "prose",
                      nonce: str = "", headers: dict[str, str] | None = None) -> PromptSource:
    """Tokenize the corpus and the instruction with the server's own tokenizer (vLLM's ``/tokenize``)."""

    async def tokenize(text: str) -> list[int]:
        payload = {"model": model, "prompt": text, "add_special_tokens": False}
        async with session.post(f"{base_url}/tokenize", json=payload, headers=headers or {}) as resp:
            if resp.status == 404:
                raise CellError(f"{base_url}/tokenize answered HTTP 404: prompts are sized with the server's own "
                                "tokenizer, so the server must offer vLLM's /tokenize endpoint")
            return (await answer_json(resp, f"{base_url}/tokenize", "tokens"))["tokens"]

    ids = await tokenize(corpus.text(kind))
    if len(ids) < 64:
        raise CellError(f"{base_url}/tokenize returned only {len(ids)} tokens for the {kind} corpus")
    return PromptSource(corpus_ids=ids, instruction_ids=await tokenize(INSTRUCTIONS[kind]), seed=seed, nonce=nonce)


@dataclass(frozen=True)
class Prompt:
    """What a request sends: text (checked to be ``tokens`` long by the server) or token ids."""

    value: str | list[int]
    tokens: int
    category: str | None = None  # a dataset prompt's category
    max_tokens: int | None = None  # a dataset prompt's own output cap (its reference output's length)

    @property
    def format(self) -> str:
        return "text" if isinstance(self.value, str) else "token_ids"


class TextAligner:
    """Turns token-id prompts into text of exactly the same token count, by the server's own tokenizer.

    The count is the one the completions endpoint will see: its tokenization adds the model's
    special tokens (a BOS for Gemma), so the text carries that many fewer content tokens (taken off
    the prompt's start, its nonce) and is checked with ``add_special_tokens`` on.
    """

    ATTEMPTS = 3

    def __init__(self, session, base_url: str, model: str, headers: dict[str, str] | None = None,
                 parallel: int = 16) -> None:
        self.session, self.base_url, self.model = session, base_url, model
        self.headers = headers or {}
        self._sem = asyncio.Semaphore(parallel)
        self.fallbacks = 0
        self.specials: int | None = None  # tokens the server adds to a text prompt

    async def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        async with self._sem, self.session.post(f"{self.base_url}{path}", json={"model": self.model, **payload},
                                                headers=self.headers) as resp:
            return await answer_json(resp, f"{self.base_url}{path}")

    async def _tokenize(self, text: str, special: bool) -> list[int]:
        return (await self._post("/tokenize", {"prompt": text, "add_special_tokens": special}))["tokens"]

    async def _detokenize(self, ids: list[int]) -> str:
        return (await self._post("/detokenize", {"tokens": ids}))["prompt"]

    async def _count_specials(self) -> int:
        probe = "The same words, tokenized twice."
        return len(await self._tokenize(probe, True)) - len(await self._tokenize(probe, False))

    async def text(self, ids: list[int], filler: list[int]) -> Prompt:
        """``ids`` as text the server will see as exactly len(ids) tokens; ``filler`` extends a short one."""
        if self.specials is None:
            self.specials = await self._count_specials()
        want = len(ids)
        content = want - self.specials
        cur = list(ids[self.specials:])
        for _ in range(self.ATTEMPTS):
            text = await self._detokenize(cur)
            got = await self._tokenize(text, False)
            if len(got) == content:
                return Prompt(text, want)
            cur = got[:content] if len(got) > content else got + filler[: content - len(got)]
        self.fallbacks += 1
        return Prompt(list(ids), want)

    async def many(self, id_lists: list[list[int]], filler: list[int]) -> list[Prompt]:
        if self.specials is None and id_lists:
            self.specials = await self._count_specials()
        return list(await asyncio.gather(*(self.text(ids, filler) for ids in id_lists)))


class LocalAligner(TextAligner):
    """The same, with the model's own tokenizer file on this machine (``tokenizer.json``, as the server
    loads it): prompts are made without a call to the server, so a decode window can get new ones
    while it measures without loading the server it measures. ``agrees_with`` checks a sample against
    the server's /tokenize before it is used."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        super().__init__(session=None, base_url="", model="")
        self.tokenizer = Tokenizer.from_file(str(path))

    async def _tokenize(self, text: str, special: bool) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=special).ids

    async def _detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    async def agrees_with(self, server: TextAligner, sample: list[Prompt]) -> bool:
        """The server counts each prompt of ``sample`` as the tokens it was built to be."""
        for p in sample:
            if isinstance(p.value, str) and len(await server._tokenize(p.value, True)) != p.tokens:
                return False
        return True


def local_aligner(model_dir: str | Path | None) -> LocalAligner | None:
    """A LocalAligner on the model's tokenizer.json, or None where there is none."""
    path = Path(model_dir) / "tokenizer.json" if model_dir else None
    if path is None or not path.is_file():
        return None
    try:
        return LocalAligner(path)
    except Exception:  # a tokenizer file this tokenizers release cannot read: the server's path serves
        return None
