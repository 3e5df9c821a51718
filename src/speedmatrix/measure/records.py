"""The requests table (``requests.parquet``: one row per request): each column declared once, as what it reads
from a request's record (``client.RequestRecord``). The cell job writes the whole table; a search judges its steps
on the columns a latency target reads (``slo.READS``), built from the same declarations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from .client import RequestRecord


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


# column -> what it reads from a record, in the table's order (after the cell's identity columns)
COLUMNS: dict[str, Callable[[RequestRecord], Any]] = {
    "request_index": lambda r: r.index,
    "worker": lambda r: r.worker,
    "prompt_tokens": lambda r: r.prompt_tokens,
    "start_s": lambda r: r.start,
    "ttft_ms": lambda r: _ms(r.ttft_s),
    "end_s": lambda r: r.end,
    "output_tokens": lambda r: r.output_tokens,
    "chunks": lambda r: len(r.chunk_times),
    "finish_reason": lambda r: r.finish_reason,
    "cut_at_window_end": lambda r: r.cut_at_window_end,
    "error": lambda r: r.error,
    "tokens_reconciled": lambda r: r.tokens_reconciled,
    "prompt_format": lambda r: r.prompt_format,
    "server_prompt_tokens": lambda r: r.server_prompt_tokens,
    "loop_detected_at_token": lambda r: r.loop_detected_at_token,
    "natural_end_char": lambda r: r.natural_end_char,
    "stopped_for_loop": lambda r: r.stopped_for_loop,
    # per streamed event: tokens and characters (a loop's onset in tokens comes from them)
    "chunk_tokens": lambda r: r.chunk_tokens,
    "chunk_chars": lambda r: r.chunk_chars,
    "phase": lambda r: r.phase,
    "repeat": lambda r: r.repeat,
    "scheduled_s": lambda r: r.scheduled,
    # when its body left, and the time it spent inside the client before (from when it was due: clientcheck)
    "sent_s": lambda r: r.sent,
    "client_wait_ms": lambda r: _ms(r.client_wait_s),
    "counted": lambda r: r.counted,
    "category": lambda r: r.category,
    "request_max_tokens": lambda r: r.max_tokens,
    "cached_tokens": lambda r: r.cached_tokens,
    "session": lambda r: r.session,
    "turn": lambda r: r.turn,
    "text": lambda r: r.text,
}


# the cell's identity on every row, before COLUMNS (the cell job's)
IDENTITY = ("experiment", "server_id", "cell_id")
# what the loop stage adds per request (``judge.loopcheck.judge_request``), joined on request_index by the aggregation
LOOP_COLUMNS = ("looped", "loop_suspected", "loop_period_chars", "loop_repeats", "loop_coverage_chars",
                "loop_onset_char", "loop_onset_token", "loop_normalized", "loop_after_natural_end")
# every column of a run's requests.parquet, in order; docs/metrics.md, "The requests table", is held to it
TABLE = (*IDENTITY, *COLUMNS, *LOOP_COLUMNS)
# what the results store keeps of each request: what the regression verdict resamples, and what says which count
STORED = ("server_id", "cell_id", "repeat", "request_index", "phase", "counted", "start_s", "end_s", "ttft_ms",
          "output_tokens", "prompt_tokens", "error", "looped")


def frame(records: Iterable[RequestRecord], columns: Sequence[str] = tuple(COLUMNS),
          ident: dict[str, Any] | None = None) -> pd.DataFrame:
    """The table of ``records``: the identity columns ``ident`` (the same on every row), then ``columns``."""
    import pandas as pd

    ident = ident or {}
    rows = [{**ident, **{c: COLUMNS[c](r) for c in columns}} for r in records]
    return pd.DataFrame(rows, columns=[*ident, *columns])
