"""A cell's status: one enumeration, with its label. A :class:`Status` is its own text (a ``StrEnum``), so the
cell JSON, the matrix and every table hold the plain word (``Status.OVER_CAPACITY == "over_capacity"``); the
code names it through here, never by a literal (tests/test_architecture.py greps for one).
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    VALID = "valid"
    UNSTABLE = "unstable"  # measured, with a spread over its repeats above the limit
    OVER_CAPACITY = "over_capacity"  # not sent: the server could not hold it at once
    LOOPED = "looped"
    CLIENT_BOUND = "client_bound"  # the client, not the server, set the figure
    SATURATED = "saturated"  # an open loop past what the server completes: its queue grew
    LOSSY = "lossy"  # speculation did not keep the target's output
    ERROR = "error"

    @property
    def label(self) -> str:
        return LABELS[self]


LABELS = {Status.VALID: "Valid", Status.LOOPED: "Looped", Status.UNSTABLE: "Unstable",
          Status.OVER_CAPACITY: "Over capacity", Status.CLIENT_BOUND: "Client-bound", Status.SATURATED: "Saturated",
          Status.LOSSY: "Lossy", Status.ERROR: "Error"}
# a figure a decision or a comparison reads (an unstable cell's comes with its wide spread, marked)
USABLE = (Status.VALID, Status.UNSTABLE)
# what a reader should look at before trusting a run's figures
NEEDS_A_LOOK = (Status.CLIENT_BOUND, Status.SATURATED, Status.LOOPED, Status.UNSTABLE, Status.LOSSY)
