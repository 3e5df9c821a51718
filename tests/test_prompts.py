"""Prompts: exact token counts, unique starts, a shared prefix that is really shared, reproducible from the seed."""

from __future__ import annotations

import pytest

from speedmatrix.measure import corpus
from speedmatrix.measure.prompts import NONCE_TOKENS, PromptSource

CORPUS = list(range(1000, 1500))
INSTRUCTION = [7, 8, 9, 10]


def source(nonce: str = "n1", seed: int = 0) -> PromptSource:
    return PromptSource(corpus_ids=CORPUS, instruction_ids=INSTRUCTION, seed=seed, nonce=nonce)


@pytest.mark.parametrize("context", [1, 5, 12, 13, 100, 4096])
def test_prompt_has_exactly_the_context_length(context):
    assert len(source().prompt(0, context, "cell")) == context


def test_prompt_ends_with_the_instruction_and_starts_unique():
    s = source()
    a, b = s.prompt(0, 256, "cell"), s.prompt(1, 256, "cell")
    assert a[-len(INSTRUCTION):] == INSTRUCTION
    assert a[:NONCE_TOKENS] != b[:NONCE_TOKENS]  # no cached block can serve one request's prompt to another


def test_same_seed_and_nonce_rebuild_the_same_prompts_and_a_new_nonce_changes_them():
    assert source("n1").prompt(3, 300, "c") == source("n1").prompt(3, 300, "c")
    assert source("n1").prompt(3, 300, "c")[:NONCE_TOKENS] != source("n2").prompt(3, 300, "c")[:NONCE_TOKENS]
    assert source(seed=1).prompt(3, 300, "c") != source(seed=2).prompt(3, 300, "c")


def test_shared_prefix_is_identical_across_requests_and_the_rest_is_not():
    s = source()
    shared = 896
    a = s.shared_prefix_prompt(0, 1024, shared, "cell")
    b = s.shared_prefix_prompt(9, 1024, shared, "cell")
    assert len(a) == len(b) == 1024
    assert a[:shared] == b[:shared]
    assert a[shared:shared + NONCE_TOKENS] != b[shared:shared + NONCE_TOKENS]
    # another cell shares nothing with this one
    assert s.shared_prefix_prompt(0, 1024, shared, "other")[:NONCE_TOKENS] != a[:NONCE_TOKENS]
    with pytest.raises(ValueError):
        s.shared_prefix_prompt(0, 1024, 1024, "cell")


def test_the_local_tokenizer_builds_prompts_of_the_exact_count(tmp_path):
    """Decode prompts made while a window measures come from the model's tokenizer on this machine."""
    import asyncio

    from tokenizers import Tokenizer

    from speedmatrix.measure import prompts
    from speedmatrix.provision import models

    models.prepare("tiny", {"synthesize": "tiny-gemma4"}, tmp_path / "tiny")
    local = prompts.local_aligner(tmp_path / "tiny")
    assert local is not None and prompts.local_aligner(tmp_path / "absent") is None
    tok = Tokenizer.from_file(str(tmp_path / "tiny" / "tokenizer.json"))
    ids = tok.encode(corpus.text("prose"), add_special_tokens=False).ids
    source = prompts.PromptSource(corpus_ids=ids, instruction_ids=ids[:20], seed=0, nonce="n")
    built = asyncio.run(local.many([source.prompt(i, 300, "salt") for i in range(5)], ids[:256]))
    assert all(p.format == "text" and len(tok.encode(p.value, add_special_tokens=True).ids) == 300 for p in built)
    assert len({p.value for p in built}) == 5
