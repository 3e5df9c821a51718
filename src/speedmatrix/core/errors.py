"""Every error speedmatrix raises on purpose, under one base class.

Each message names what is wrong (a file and key, a server config, a cell)
and says what to do; callers catch :class:`SpeedmatrixError` to print it
without a traceback.
"""

from __future__ import annotations


class SpeedmatrixError(Exception):
    """Base class: a failure with a message for the user."""


class ConfigError(SpeedmatrixError, ValueError):
    """Bad input: the message names the file and the key, and says what to do."""


class CellError(SpeedmatrixError, RuntimeError):
    """A measurement that cannot be trusted (server died, requests failed, server busy): the cell writes nothing."""
