"""Text kept in the repository: the material prompts and the tiny tokenizer are built from."""

from __future__ import annotations

from importlib import resources

KINDS = ("prose", "code")


def text(kind: str = "prose") -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown corpus {kind!r}; known: {', '.join(KINDS)}")
    return resources.files("speedmatrix.data.corpus").joinpath(f"{kind}.txt").read_text("utf-8")


def all_text() -> str:
    return "\n\n".join(text(k) for k in KINDS)
