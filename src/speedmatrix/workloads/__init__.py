"""Workload kinds: one module each, behind one interface (``base.Workload``), in one table (``REGISTRY``).

To add a kind: write a module here with a ``@register``-ed subclass of ``Workload``, and add its block to
``data/schemas/experiment.schema.yaml``. Every module of this package is imported below, so the module
registers itself; cell ids, the workflow's rules, the SLURM groups, the CLI, the matrix and the report take
the list from ``REGISTRY``. A module that registers no kind holds what kinds share (``base``: the interface).
"""

import importlib
import pkgutil

from .base import (
    REGISTRY,
    Cell,
    CellRun,
    Measured,
    Workload,
    cell_id_pattern,
    cell_key_pattern,
    get,
    names,
    order_of,
    register,
    sampling_of,
)

# each module registers its kind as it is imported; the order of the kinds is their ``order``, not this one
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["REGISTRY", "Cell", "CellRun", "Measured", "Workload", "cell_id_pattern", "cell_key_pattern", "get",
           "names", "order_of", "register", "sampling_of"]
