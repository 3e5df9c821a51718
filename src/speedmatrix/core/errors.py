"""Every error speedmatrix raises on purpose, under one base class, all in this module.

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


class DatasetError(SpeedmatrixError):
    """A dataset that cannot be read as its experiment says: names the file or repository and the key."""


class TraceError(SpeedmatrixError):
    """A trace that cannot be read or scaled as its experiment says (names the file or the key)."""


class ModelError(SpeedmatrixError, RuntimeError):
    """A model could not be had; the message says which and what to do (and never holds a token)."""


class RegistryError(SpeedmatrixError, RuntimeError):
    """A container registry that did not give an image's digest: names the image, the registry and its answer."""


class ServerError(SpeedmatrixError, RuntimeError):
    """A server config's server could not be started or held; the message names the config and vLLM's reason."""


class RederiveError(SpeedmatrixError):
    """A results folder that cannot be re-derived: the message says what is missing."""


class BundleError(SpeedmatrixError):
    """An offline bundle that cannot be made or read: the message says which package or file, and what to do."""


class StoreError(SpeedmatrixError):
    """The results store (history.sqlite) or a run asked of it: not there, not a run, ambiguous."""


class ResultFileError(SpeedmatrixError, ValueError):
    """A file a run wrote that cannot be read back (damaged, cut short): names the file and says what to do."""


class EngineCheckError(SpeedmatrixError, RuntimeError):
    """The runtime's Python could not run vLLM's own checks of an experiment (speedmatrix.jobs.enginecheck): the
    check is reported as not run, with this reason."""


class NoCellInCommon(SpeedmatrixError, ValueError):
    """Two runs compared with no cell in common: nothing comparable (exit 4, as regress says it)."""
