"""Tables stacked from many files (each cell's requests): pandas' concatenation without its deprecated handling of
empty and all-missing columns (a run cut short has cells whose requests all failed: every timing column missing),
which warns once per file today and will change the result's types in a later pandas."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd


def stack(frames: Iterable[pd.DataFrame], columns: list[str] | None = None) -> pd.DataFrame:
    """The frames one under another, every column any of them has (in first-seen order, or ``columns``); a column
    missing or all missing in a frame is missing in its rows, and never decides the column's type."""
    frames = [f for f in frames if len(f)]
    order = list(columns or dict.fromkeys(c for f in frames for c in f.columns))
    if not frames:
        return pd.DataFrame(columns=order)
    return pd.concat([f.dropna(axis=1, how="all") for f in frames], ignore_index=True).reindex(columns=order)
