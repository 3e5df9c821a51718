"""Loop detection: exact periodicity at the end of a generated text.

A text "loops" when its tail is one unit repeated verbatim. For the reversed
text r, the prefix r[:L] (the last L characters of the text) has smallest
period L - pi[L-1], where pi is the prefix function (Knuth-Morris-Pratt); one
linear pass therefore gives, for every tail length L, its period and how many
times the unit repeats. The verdict takes the longest tail that repeats at
least ``min_repeats`` times.

A second pass runs on a normalized copy (every digit run folded to "0",
every whitespace run to one space) and catches incrementing loops
("Step 7: ...", "Step 8: ...") as *suspected*, when the repeated unit holds
at least ``normalized_min_words`` words: numbers alone (an array, metric
records) fold to a repeating unit without being a loop. A shorter unit (a
counter and a fragment of words or symbols, "Item 7: ok") is suspected when it
repeats ``counter_min_repeats`` times and every number in it is a counter
(``counter_loop``): records and tables carry numbers that vary.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULTS = {
    "looped_min_repeats": 4,
    "looped_min_coverage_chars": 4096,
    "suspected_min_repeats": 3,
    "suspected_min_coverage_chars": 1024,
    # the normalized pass only counts a unit with this many words (2+ letters): an incrementing
    # loop repeats a sentence; a numeric array or metric records fold to a wordless unit
    "normalized_min_words": 4,
    # a shorter unit (a counter and a few words or symbols: "Item 7: ok") counts when it repeats this
    # many times and every number in it is a counter (the same, or growing by the same step, from one
    # repeat to the next): metric records and tables carry numbers that vary, arrays have no words
    "counter_min_repeats": 20,
}
_WORD = re.compile(r"[^\W\d_]{2,}")
_TOKEN = re.compile(r"\d+|\s+|.", re.S)
# what a unit needs besides its numbers to be a short incrementing loop: a word, or a symbol that is
# not a list separator or part of a number
_CONTENT = re.compile(r"[^\W\d_]|[^\w\s,.;:+\-\[\]()]")


@dataclass
class Verdict:
    looped: bool
    suspected: bool
    period_chars: int | None
    repeats: float
    coverage_chars: int
    onset_char: int | None
    normalized: bool = False
    length_chars: int = 0
    thresholds: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def prefix_function(seq: Sequence) -> list[int]:
    n = len(seq)
    pi = [0] * n
    k = 0
    for i in range(1, n):
        while k and seq[i] != seq[k]:
            k = pi[k - 1]
        if seq[i] == seq[k]:
            k += 1
        pi[i] = k
    return pi


def tail_periodicity(seq: Sequence, min_repeats: float) -> tuple[int, int]:
    """Longest tail of ``seq`` that is a unit repeated >= min_repeats times.

    Returns (coverage, period); (0, 0) when no tail qualifies. Coverage counts
    the whole periodic tail, including a partial unit at its start.
    """
    rev = seq[::-1]
    pi = prefix_function(rev)
    best = (0, 0)
    for length in range(2, len(rev) + 1):
        period = length - pi[length - 1]
        if period < length and length / period >= min_repeats:
            best = (length, period)
    return best


_DIGITS = re.compile(r"\d+")
_SPACES = re.compile(r"\s+")


def normalize(text: str) -> str:
    return _SPACES.sub(" ", _DIGITS.sub("0", text))


def counter_loop(text: str, min_repeats: float, min_chars: int) -> tuple[int, int] | None:
    """A tail that repeats one short unit in which every number is a counter: (coverage chars, period chars).

    The text becomes tokens (a number, a run of whitespace, or one other character) with every number
    folded to one marker; the tail periodicity is found over the tokens. Each numeric slot of the unit
    must take the same value in every repeat, or grow by the same step, and one must grow."""
    tokens = _TOKEN.findall(text)
    folded = ["0" if t[0].isdigit() else (" " if t[0].isspace() else t) for t in tokens]
    cov, per = tail_periodicity(folded, min_repeats)
    if not cov or cov // per < min_repeats:
        return None
    tail = tokens[len(tokens) - (cov // per) * per:]
    unit = folded[len(folded) - per:]
    if not _CONTENT.search("".join(unit)):
        return None  # numbers and separators only: an array
    grows = False
    for slot in (k for k, t in enumerate(unit) if t == "0"):
        values = [int(tail[j]) for j in range(slot, len(tail), per)]
        steps = {b - a for a, b in zip(values, values[1:])}
        if len(steps) > 1:
            return None  # a number that varies: a record, not a loop
        grows = grows or steps != {0}
    chars = sum(len(t) for t in tail)
    if not grows or chars < min_chars:
        return None
    return chars, round(chars / (len(tail) // per))


def _judge(seq: Sequence, th: dict[str, Any]) -> tuple[bool, bool, int, int]:
    cov_s, per_s = tail_periodicity(seq, th["suspected_min_repeats"])
    looped = False
    cov_l, per_l = tail_periodicity(seq, th["looped_min_repeats"])
    if cov_l >= th["looped_min_coverage_chars"]:
        looped = True
        cov_s, per_s = cov_l, per_l
    suspected = looped or cov_s >= th["suspected_min_coverage_chars"]
    return looped, suspected, cov_s, per_s


def detect(text: str, **thresholds: Any) -> Verdict:
    """Judge one generated text. Thresholds default to :data:`DEFAULTS`."""
    unknown = set(thresholds) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown loop threshold(s): {', '.join(sorted(unknown))}")
    th = {**DEFAULTS, **thresholds}
    looped, suspected, cov, per = _judge(text, th)
    normalized = False
    if not suspected:
        norm = normalize(text)
        if norm != text:
            _, n_susp, n_cov, n_per = _judge(norm, th)
            if n_susp and len(_WORD.findall(norm[len(norm) - n_per:])) >= th["normalized_min_words"]:
                suspected, normalized = True, True
                # map coverage on the normalized copy back to an approximate onset
                cov = min(len(text), round(n_cov * len(text) / max(1, len(norm))))
                per = n_per
            else:
                found = counter_loop(text, th["counter_min_repeats"], th["suspected_min_coverage_chars"])
                if found:
                    suspected, normalized = True, True
                    cov, per = found
    return Verdict(
        looped=looped,
        suspected=suspected,
        period_chars=per or None,
        repeats=round(cov / per, 2) if per else 0.0,
        coverage_chars=cov,
        onset_char=len(text) - cov if cov else None,
        normalized=normalized,
        length_chars=len(text),
        thresholds=th,
    )


def detect_tokens(token_ids: Sequence[int], min_repeats: float = 4, min_coverage_tokens: int = 1024) -> dict:
    """The same exact-periodicity test over token ids (where the ids are known)."""
    cov, per = tail_periodicity(list(token_ids), min_repeats)
    return {
        "looped": cov >= min_coverage_tokens,
        "period_tokens": per or None,
        "repeats": round(cov / per, 2) if per else 0.0,
        "coverage_tokens": cov,
        "onset_token": len(token_ids) - cov if cov else None,
    }


class OnlineWatch:
    """Loop watch over a stream while it arrives: cheap enough to run on every request.

    The stream's pieces stay in the caller's list; every ``check_every_chars``
    of new text the watch folds them into a window of the last ``window``
    characters and looks for a verbatim loop at its end with C-speed string
    operations: the most recent earlier occurrence of the last 64 characters
    gives a candidate period p, and the tail is periodic with p when
    ``tail[p:] == tail[:-p]`` over max(min_coverage, min_repeats x p)
    characters. A hit is confirmed by :func:`detect` on the window (the
    offline verdict, same thresholds), so the watch never stops a request the
    loop stage would not call looped.
    """

    NEEDLE = 64
    CANDIDATES = 4

    def __init__(self, check_every_chars: int = 2048, **thresholds: Any) -> None:
        self.th = {**DEFAULTS, **thresholds}
        self.check_every_chars = check_every_chars
        self.window_chars = 2 * max(self.th["looped_min_coverage_chars"], 8192)
        self._window = ""
        self._consumed = 0  # pieces already folded into the window
        self._chars_at_check = 0
        self.chars = 0
        self.checks = 0
        self.verdict: Verdict | None = None
        self.next_at = 0  # fold and maybe check when the caller's piece count reaches this

    def update(self, parts: list[str]) -> bool:
        """Fold new pieces in; True when the stream is looping (the verdict is in ``self.verdict``)."""
        new = "".join(parts[self._consumed:])
        self._consumed = len(parts)
        self.chars += len(new)
        self._window = (self._window + new)[-self.window_chars:]
        # pieces are a few characters: look again after about check_every_chars more
        self.next_at = len(parts) + max(1, self.check_every_chars // 8)
        if self.chars - self._chars_at_check < self.check_every_chars:
            return False
        self._chars_at_check = self.chars
        self.checks += 1
        if not self._tail_is_periodic():
            return False
        v = detect(self._window, **self.th)
        if v.looped:
            v.onset_char = None if v.onset_char is None else self.chars - len(self._window) + v.onset_char
            v.length_chars = self.chars
            self.verdict = v
            return True
        return False

    def _tail_is_periodic(self) -> bool:
        w = self._window
        n = len(w)
        if n < self.th["looped_min_coverage_chars"]:
            return False
        needle = w[-self.NEEDLE:]
        end = n - 1
        for _ in range(self.CANDIDATES):
            pos = w.rfind(needle, 0, end)
            if pos < 0:
                return False
            p = n - self.NEEDLE - pos
            span = max(self.th["looped_min_coverage_chars"], int(self.th["looped_min_repeats"] * p))
            if span <= n and w[n - span + p:] == w[n - span:n - p]:
                return True
            end = pos + self.NEEDLE - 1
        return False
