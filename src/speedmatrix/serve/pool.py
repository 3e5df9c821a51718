"""A node's GPUs as a pool: server configs on disjoint GPUs measure at the same time.

The workflow's pool is the GPUs it may use on this node: config ``gpus`` (a count, or the ids as
CUDA_VISIBLE_DEVICES names them), else what NVML counts on a GPU runtime (the workflow's own
CUDA_VISIBLE_DEVICES, if set, is the pool); none on the CPU. Each server config takes ``tensor x
pipeline parallel`` GPUs of it for its server's life (the server's CUDA_VISIBLE_DEVICES).

Two mechanisms, one for each side:

* **Snakemake** runs cells at the same time only when their ``device`` claims fit the pool's units
  (a cell that may run beside others claims its config's GPUs, one that must run alone claims all
  of them), and never two cells of one config at once (a mutex resource per config: a config's
  cells share one server and would measure each other).
* **The cell** (``server.acquire``, ``placement.place``) places its config's server on free GPUs, stopping idle servers
  of other configs when GPUs are short, and measures under a host-wide lock held shared by cells
  that may run side by side and alone by an isolated cell; each cell records which others
  measured while it did (``beside``).

Without a pool (the CPU, one GPU), or for a runtime whose GPUs the pipeline cannot place (a
container: its GPUs are its ``gpus`` option), every cell claims the whole device: one at a time,
exactly as before.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigError

if TYPE_CHECKING:  # types only: a cell job holds a Placement, not an experiment
    from ..plan.experiment import Experiment

WHOLE_DEVICE = "device"


@dataclass(frozen=True)
class Placement:
    """Where a cell's server may run and whether the cell may measure beside others.

    ``pool``: the GPUs this workflow may use; empty means one undivided device (every server holds
    all of it; one server at a time). ``gpus``: how many of the pool the server config takes.
    ``isolated``: the cell measures with nothing else measuring on this host."""

    pool: tuple[str, ...] = ()
    gpus: int = 1
    isolated: bool = True

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Placement:
        d = d or {}
        return cls(tuple(str(g) for g in d.get("pool") or ()), int(d.get("gpus") or 1),
                   bool(d.get("isolated", True)))

    def as_dict(self) -> dict[str, Any]:
        return {"pool": list(self.pool), "gpus": self.gpus, "isolated": self.isolated}

    @property
    def units(self) -> tuple[str, ...]:
        return self.pool or (WHOLE_DEVICE,)

    def need(self) -> int:
        """Units a server of this config takes: its GPUs (at most the pool), or the whole device."""
        return min(max(1, self.gpus), len(self.pool)) if self.pool else 1


def nvml_count() -> int:
    from ..measure.telemetry import _nvml

    nvml = _nvml()
    return int(nvml.nvmlDeviceGetCount()) if nvml is not None else 0


def node_pool(given: Any, exp: Experiment, count=nvml_count) -> tuple[str, ...]:
    """The workflow's GPU pool: ``given`` (config ``gpus``: a count or a list of ids), else NVML's
    count on a GPU runtime (within this process's CUDA_VISIBLE_DEVICES); () for one undivided
    device. A pool of one GPU is one undivided device too."""
    ids = node_gpus(given, exp, count)
    return ids if len(ids) > 1 else ()


def node_gpus(given: Any, exp: Experiment, count=nvml_count) -> tuple[str, ...]:
    """Every GPU this node gives the run: ``given`` (config ``gpus``), else this process's CUDA_VISIBLE_DEVICES,
    else NVML's count on a GPU runtime; () on the CPU or where none can be counted."""
    if given is None or given == "":
        if exp.runtime["device"] == "cpu":
            return ()
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        return tuple(visible) if visible else tuple(str(i) for i in range(count()))
    if isinstance(given, bool):
        raise ConfigError(f"config key 'gpus': give a number of GPUs or a list of GPU ids, not {given!r}")
    if isinstance(given, int) or (isinstance(given, str) and given.isdigit()):
        return tuple(str(i) for i in range(int(given)))
    if isinstance(given, (list, tuple)) or isinstance(given, str):
        return tuple(str(g).strip() for g in (given.split(",") if isinstance(given, str) else given))
    raise ConfigError(f"config key 'gpus': give a number of GPUs or a list of GPU ids, not {given!r}")


def parallel_allowed(exp: Experiment, kind: str) -> bool:
    """The experiment's ``parallel``: true/false, or per workload kind ({default: true, decode: false})."""
    p = exp.raw.get("parallel", True)
    if isinstance(p, dict):
        return bool(p.get(kind, p.get("default", True)))
    return bool(p)


def placeable(exp: Experiment, server_id: str) -> bool:
    """The pipeline can put this config's server on GPUs it chooses: a local runtime whose config does
    not name its own CUDA_VISIBLE_DEVICES."""
    srv = exp.server(server_id)
    return exp.runtime["kind"] == "local" and "CUDA_VISIBLE_DEVICES" not in srv.env


def placement(exp: Experiment, server_id: str, kind: str, pool: tuple[str, ...]) -> Placement:
    """A job's placement: its config's share of the pool and whether it may measure beside others."""
    if not pool or not placeable(exp, server_id):
        return Placement((), 1, True)
    gpus = exp.server(server_id).parallel_size
    return Placement(pool, gpus, not parallel_allowed(exp, kind) or gpus >= len(pool))


def device_units(pool: tuple[str, ...]) -> int:
    """The ``device`` resource Snakemake schedules with: the pool's GPUs, or 1 (one undivided device)."""
    return max(1, len(pool))


def device_claim(p: Placement, units: int) -> int:
    """A job's ``device`` claim: its config's GPUs when it may run beside others, else all units."""
    return units if p.isolated or not p.pool else p.need()
