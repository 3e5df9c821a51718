"""One job context for every rule that talks to a server config's server (cells, gates, reference).

The experiment's name, its launch spec and runtime lock, the results root (where the
device lock and the registry of running servers live) and the experiment's
results directory (its measurement archive) come from the rule's params and inputs,
never from counting parent directories of a path. A cell job is handed its cell and
settings by its rule and never loads the experiment; a gate or reference job loads it
when it first asks (``experiment``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..core import atomic, host
from ..core.errors import CellError
from ..measure import client, telemetry
from ..serve import server
from ..serve.pool import Placement


def scheduler_env() -> dict[str, str]:
    keys = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_NODELIST", "SLURM_STEP_ID", "SLURM_GPUS_ON_NODE")
    return {k: os.environ[k] for k in keys if k in os.environ}


def provenance(startup: dict[str, Any], runtime_lock: dict[str, Any], launch: dict[str, Any]) -> dict[str, Any]:
    """Where a result comes from: the server start, the runtime, the models, the host and the scheduler."""
    return {
        "speedmatrix_version": __version__,
        "hostname": socket.gethostname(),
        "server_start_id": startup.get("start_id"),
        "server_started_at": startup.get("started_at"),
        "vllm_version": startup.get("vllm_version"),
        "runtime_ref": runtime_lock.get("runtime_ref"),
        "packages_sha256": runtime_lock.get("packages_sha256"),
        "launch_argv": startup.get("argv"),
        # GiB of weights on each GPU, from the server's log (the decode roofline's numerator)
        "model_weights_gib": startup.get("model_weights_gib"),
        # what the server's GPUs drew before it started (W, NVML; None on the CPU): energy above idle
        "gpu_idle_power_w": startup.get("gpu_idle_power_w"),
        # how fast one host core ran Python just before the server started (ms, less is faster: host.speed_probe)
        "host_probe_ms": startup.get("host_probe_ms"),
        # the node's GPUs the server held (a GPU pool; None: the whole device)
        "server_gpus": startup.get("gpus"),
        "models": launch.get("models"),
        "scheduler": scheduler_env(),
        # the machine and the code: the results store's run table reads these
        **host.facts(),
        "gpu_driver": telemetry.driver_version(),
    }


@dataclass
class JobContext:
    experiment_name: str
    experiments_dir: str
    server_id: str
    launch: dict[str, Any]
    lock: dict[str, Any]
    results_root: Path  # config results_dir: the device lock and the running servers' registry
    idle_timeout_s: float
    launch_path: Path
    # the node's GPU pool, this config's share and whether the job may measure beside others
    placement: Placement = Placement()
    label: str = ""  # what the job measures (a cell id), for the record of who measured beside whom

    @classmethod
    def load(cls, experiment_name: str, experiments_dir: str, results_root: str, server_id: str,
             launch_path: str, lock_path: str, idle_timeout_s: float, placement: dict | None = None,
             label: str = "") -> JobContext:
        return cls(experiment_name=experiment_name, experiments_dir=experiments_dir, server_id=server_id,
                   launch=atomic.read_json(launch_path), lock=atomic.read_json(lock_path),
                   results_root=Path(results_root).resolve(), idle_timeout_s=float(idle_timeout_s),
                   launch_path=Path(launch_path), placement=Placement.from_dict(placement), label=label)

    @classmethod
    def from_snakemake(cls, smk: Any) -> JobContext:
        """From a rule's ``snakemake`` object: params experiment, experiments_dir, results_root,
        idle_timeout_s, placement (optional), cell_id or gate (optional); inputs launch and lock;
        wildcard server_id."""
        p = smk.params
        label = getattr(p, "cell_id", None) or getattr(p, "gate", None) or smk.rule
        return cls.load(p.experiment, p.experiments_dir, p.results_root, smk.wildcards.server_id,
                        smk.input.launch, smk.input.lock, p.idle_timeout_s, getattr(p, "placement", None),
                        str(label))

    @functools.cached_property
    def experiment(self) -> Any:
        """The experiment, loaded and checked on first use (the gate and reference jobs; a cell job's rule hands it
        its cell and settings instead)."""
        from ..plan import experiment

        return experiment.load(self.experiment_name, self.experiments_dir)

    @property
    def results(self) -> Path:
        """``<results_root>/<experiment>``: this run's outputs and its measurement archive."""
        return self.results_root / self.experiment_name

    def use_api_key(self) -> None:
        """The server's key (config: api_key_env) is what the client sends; it stays in this process's
        environment and the server's, never in a file."""
        name = self.launch.get("api_key_env")
        if not name:
            return
        if not os.environ.get(name):
            raise CellError(f"server config {self.server_id} takes its API key from the environment variable "
                            f"{name}, which is not set: export {name}=... and run again")
        os.environ[client.API_KEY_ENV] = os.environ[name]

    @contextlib.contextmanager
    def server(self, progress: Callable[[str], None] = print) -> Iterator[dict[str, Any]]:
        """Hold the device and this config's running server (started on first use) for the job."""
        with server.acquire(self.results_root, self.experiment_name, self.server_id, self.launch,
                            self.idle_timeout_s, progress, self.placement, self.label) as info:
            yield info

    @staticmethod
    def server_healthy(info: dict[str, Any]) -> bool:
        return server.healthy(info)

    def provenance(self, startup: dict[str, Any]) -> dict[str, Any]:
        return provenance(startup, self.lock, self.launch)
