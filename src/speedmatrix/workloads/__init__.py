"""Workload kinds: one module each, behind one interface (``base.Workload``), in one table (``REGISTRY``).

To add a kind: write a module here with a ``@register``-ed subclass of
``Workload``, import it below, and add its block to
``data/schemas/experiment.schema.yaml``. Cell ids, the workflow's rules, the
SLURM groups, the CLI and the report take the list from here.
"""

from . import (  # noqa: F401  (each registers its kind)
    capacity,
    decode,
    latency,
    prefill,
    prefix_cache,
    rate,
    rate_search,
    rate_sweep,
    replay,
    replay_search,
    session_search,
    sessions,
    slo_search,
)
from .base import (
           CELL_KEY_PATTERN,
           REGISTRY,
           Cell,
           CellRun,
           Measured,
           Workload,
           cell_id_pattern,
           get,
           names,
           order_of,
           register,
)

__all__ = ["REGISTRY", "Cell", "CellRun", "Measured", "Workload", "cell_id_pattern", "get", "names", "order_of",
           "register", "CELL_KEY_PATTERN"]
