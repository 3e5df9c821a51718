"""What a check's exit status says: one table of outcomes for `speedmatrix regress` (a nightly job's gate) and
`speedmatrix reproduce`, the same codes wherever a command judges runs.

An outcome is the most severe thing found between two runs, in this order: a cell lost to the server, nothing
comparable, a cell slower, a measurement problem that is not the server's; else pass. Bad input (not a run, an
unknown id, an empty store, a usage error) is 2, argparse's own code, before anything is judged.
"""

from __future__ import annotations

from enum import IntEnum


class Outcome(IntEnum):
    PASS = 0
    SLOWER = 1
    BAD_INPUT = 2
    LOST = 3
    NOTHING_COMPARABLE = 4
    MEASUREMENT = 5


MEANING = {
    Outcome.PASS: "pass: no cell slower beyond its minimum effect, none lost, no measurement problem",
    Outcome.SLOWER: "a figure of a cell significantly slower beyond its minimum effect (reproduce: agreement under "
                    "--min-agreement)",
    Outcome.BAD_INPUT: "bad input: not a run, an unknown run id, an empty store, a usage error",
    Outcome.LOST: "a cell the base measured lost to the server in the new run (failed, looped, over capacity, "
                  "lossy, or a job that did not run: a release whose servers did not start)",
    Outcome.NOTHING_COMPARABLE: "no cell has a figure in both runs (runs of experiments that share no cell)",
    Outcome.MEASUREMENT: "a measurement problem that is not the server's (a Client-bound cell, too few requests)",
}
# the first one found is the outcome
SEVERITY = (Outcome.LOST, Outcome.NOTHING_COMPARABLE, Outcome.SLOWER, Outcome.MEASUREMENT)


def first(found: set[Outcome]) -> Outcome:
    """The outcome of a check that found ``found``: the most severe, else pass."""
    return next((o for o in SEVERITY if o in found), Outcome.PASS)


def exit_statuses() -> str:
    """Every exit status with its meaning (a command's --help)."""
    return "; ".join(f"{int(o)} {MEANING[o]}" for o in Outcome)
