"""The exact-periodicity loop detector on labelled texts."""

from __future__ import annotations

import random

import pytest

from speedmatrix import corpus, loops

NATURAL = [corpus.text("prose"), corpus.text("code"), corpus.text("prose")[:3000]]


@pytest.mark.parametrize("text", NATURAL)
def test_natural_text_is_not_a_loop(text):
    v = loops.detect(text)
    assert not v.looped and not v.suspected


@pytest.mark.parametrize("period", [1, 7, 13, 100, 577, 2000])
def test_verbatim_loops_are_found(period):
    rng = random.Random(period)
    unit = "".join(rng.choice("abcdefghij klmnop,.") for _ in range(period))
    head = corpus.text("prose")[:500]
    reps = max(4, -(-5000 // period))  # at least 4 repeats, at least 5000 characters
    text = head + unit * reps
    v = loops.detect(text)
    assert v.looped and v.suspected
    assert v.period_chars == period
    assert v.onset_char <= len(head)
    assert v.coverage_chars >= period * reps


def test_short_loop_is_only_suspected():
    v = loops.detect(corpus.text("prose")[:300] + "the same words. " * 100)  # 1600 chars
    assert v.suspected and not v.looped


def test_incrementing_loop_is_suspected():
    text = "".join(f"Step {i}: check the value and continue.\n" for i in range(1, 80))
    v = loops.detect(text)
    assert v.suspected and v.normalized and not v.looped


def test_thresholds_are_configurable():
    text = "abcabc " * 50
    assert not loops.detect(text).suspected
    assert loops.detect(text, suspected_min_coverage_chars=100).suspected
    with pytest.raises(ValueError):
        loops.detect(text, nonsense=1)


def test_token_variant():
    ids = list(range(50)) + [5, 6, 7] * 500
    v = loops.detect_tokens(ids)
    assert v["looped"] and v["period_tokens"] == 3 and v["onset_token"] <= 50
