"""GPU telemetry through NVML (nvidia-ml-py), sampled during a cell's measurement window only.

Per GPU the server uses: power (W), the energy counter's change (J), SM and
memory utilisation (%), SM and memory clocks (MHz), PCIe receive and transmit
(MB/s) and temperature (°C). Where NVML is absent (the CPU default, CI) there
is no sampler and no field: nothing fails.

The roofline of decode at concurrency 1: every step reads every weight once,
so a token takes at least (weight bytes on a GPU) / (the GPU's peak memory
bandwidth); ``roofline`` compares that bound with the measured time between
tokens. Peak bandwidths are in ``data/gpu_peaks.yaml`` (datasheet figures).
"""

from __future__ import annotations

import os
import threading
import time
from importlib import resources
from pathlib import Path
from statistics import mean
from typing import Any

import yaml

PEAKS_FILE = Path(str(resources.files("speedmatrix") / "data" / "gpu_peaks.yaml"))


def _nvml():
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU: NVML is absent
        return None
    return pynvml


def visible_indices(nvml, env: dict[str, str] | None = None) -> list[int]:
    """The NVML indices of the GPUs the server sees (its CUDA_VISIBLE_DEVICES, else all)."""
    count = nvml.nvmlDeviceGetCount()
    visible = (env or {}).get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible:
        out = [int(v) for v in visible.split(",") if v.strip().isdigit() and int(v) < count]
        if out:
            return out
    return list(range(count))


def driver_version() -> str | None:
    """The NVIDIA driver's version (None without NVML)."""
    nvml = _nvml()
    if nvml is None:
        return None
    version = nvml.nvmlSystemGetDriverVersion()
    return version.decode() if isinstance(version, bytes) else version


def gpu_names(env: dict[str, str] | None = None) -> list[str] | None:
    nvml = _nvml()
    if nvml is None:
        return None
    names = []
    for i in visible_indices(nvml, env):
        name = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))
        names.append(name.decode() if isinstance(name, bytes) else name)
    return names


class Sampler:
    """Samples every ``interval_s`` in a thread between start() and stop(); stop() returns the summary."""

    def __init__(self, interval_s: float = 0.2, env: dict[str, str] | None = None):
        self.nvml = _nvml()
        self.interval_s = interval_s
        self.env = env
        self.samples: list[list[dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self.nvml is not None

    def _read(self, h) -> dict[str, float]:
        n = self.nvml
        out: dict[str, float] = {}
        readers = {
            "power_w": lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "energy_mj": lambda: float(n.nvmlDeviceGetTotalEnergyConsumption(h)),
            "sm_util_pct": lambda: float(n.nvmlDeviceGetUtilizationRates(h).gpu),
            "mem_util_pct": lambda: float(n.nvmlDeviceGetUtilizationRates(h).memory),
            "sm_clock_mhz": lambda: float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            "mem_clock_mhz": lambda: float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
            # NVML's PCIe counters are KB/s over a 20 ms window
            "pcie_rx_mb_s": lambda: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES) / 1000.0,
            "pcie_tx_mb_s": lambda: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES) / 1000.0,
            "temp_c": lambda: float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
        }
        for key, read in readers.items():
            try:
                out[key] = read()
            except Exception:  # a counter this GPU does not have
                pass
        # NVLink data counters (KiB, cumulative; GPU-to-GPU traffic that PCIe counters do not see)
        fields = [getattr(n, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", None),
                  getattr(n, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", None)]
        if None not in fields:
            try:
                tx, rx = n.nvmlDeviceGetFieldValues(h, fields)
                if not tx.nvmlReturn and not rx.nvmlReturn:
                    out["nvlink_tx_kib"] = float(tx.value.ullVal)
                    out["nvlink_rx_kib"] = float(rx.value.ullVal)
            except Exception:
                pass
        return out

    def _loop(self, handles) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            self.samples.append([{"t": t, **self._read(h)} for h in handles])
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t)))

    def start(self) -> None:
        if not self.available:
            return
        self.indices = visible_indices(self.nvml, self.env)
        handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in self.indices]
        self.names = []
        for h in handles:
            name = self.nvml.nvmlDeviceGetName(h)
            self.names.append(name.decode() if isinstance(name, bytes) else name)
        self._thread = threading.Thread(target=self._loop, args=(handles,), daemon=True)
        self._thread.start()

    def stop(self, output_tokens: int | None = None) -> dict[str, Any] | None:
        """The window's summary (None without NVML): per GPU and over all GPUs."""
        if not self.available or self._thread is None:
            return None
        self._stop.set()
        self._thread.join(timeout=5)
        if len(self.samples) < 2:
            return None
        per_gpu = []
        for g, idx in enumerate(self.indices):
            series = [s[g] for s in self.samples]
            row: dict[str, Any] = {"index": idx, "name": self.names[g], "samples": len(series)}
            for key in ("power_w", "sm_util_pct", "mem_util_pct", "sm_clock_mhz", "mem_clock_mhz",
                        "pcie_rx_mb_s", "pcie_tx_mb_s"):
                vals = [s[key] for s in series if key in s]
                if vals:
                    row[f"{key}_mean"] = round(mean(vals), 3)
                    row[f"{key}_max"] = round(max(vals), 3)
            temps = [s["temp_c"] for s in series if "temp_c" in s]
            if temps:
                row["temp_c_max"] = max(temps)
            e = [s["energy_mj"] for s in series if "energy_mj" in s]
            if len(e) >= 2:
                row["energy_j"] = round((e[-1] - e[0]) / 1000.0, 3)
            span = series[-1]["t"] - series[0]["t"]
            for key in ("nvlink_tx", "nvlink_rx"):
                c = [s[f"{key}_kib"] for s in series if f"{key}_kib" in s]
                if len(c) >= 2 and span > 0:
                    row[f"{key}_mb_s"] = round((c[-1] - c[0]) * 1.024 / span, 3)
            per_gpu.append(row)
        window_s = self.samples[-1][0]["t"] - self.samples[0][0]["t"]
        out: dict[str, Any] = {"gpu_name": self.names[0], "gpu_count": len(per_gpu), "window_s": round(window_s, 3),
                               "interval_s": self.interval_s, "per_gpu": per_gpu}

        def total(key):
            vals = [r[key] for r in per_gpu if key in r]
            return round(sum(vals), 3) if vals else None

        def avg(key):
            vals = [r[key] for r in per_gpu if key in r]
            return round(mean(vals), 3) if vals else None

        out.update({
            "gpu_power_w": total("power_w_mean"),
            "gpu_energy_j": total("energy_j"),
            "gpu_sm_util_pct": avg("sm_util_pct_mean"),
            "gpu_mem_util_pct": avg("mem_util_pct_mean"),
            "gpu_sm_clock_mhz": avg("sm_clock_mhz_mean"),
            "gpu_mem_clock_mhz": avg("mem_clock_mhz_mean"),
            "gpu_pcie_rx_mb_s": total("pcie_rx_mb_s_mean"),
            "gpu_pcie_tx_mb_s": total("pcie_tx_mb_s_mean"),
            "gpu_temp_c_max": max((r["temp_c_max"] for r in per_gpu if "temp_c_max" in r), default=None),
            "gpu_nvlink_tx_mb_s": total("nvlink_tx_mb_s"),
            "gpu_nvlink_rx_mb_s": total("nvlink_rx_mb_s"),
        })
        if out["gpu_energy_j"] is not None and output_tokens:
            out["gpu_energy_per_output_token_j"] = round(out["gpu_energy_j"] / output_tokens, 6)
        return out


def idle_power(env: dict[str, str] | None = None, seconds: float = 1.5, settle_s: float = 30.0,
               ) -> dict[str, Any] | None:
    """The power of the GPUs a server will use before it starts (None without NVML): what they draw doing
    nothing, so that a cell's energy above idle can be read (``above_idle``).

    Sampled in windows of ``seconds`` until a window draws no less than the one before (within 2 % or 1 W), at
    most ``settle_s``: a GPU another server just left still draws above idle for a while (on an H200, 105.8 W
    right after a server stopped, 76.6 W settled). The reading is the last window's; ``gpu_idle_settled`` says
    whether the power stopped falling in time, ``gpu_idle_wait_s`` how long it took."""
    t0 = time.monotonic()
    before = None
    while True:  # a sampler a window (a Sampler measures one window)
        sampler = Sampler(interval_s=min(0.2, seconds / 5), env=env)
        if not sampler.available:
            return None
        sampler.start()
        time.sleep(seconds)
        summary = sampler.stop()
        if not summary:
            return None
        power = summary["gpu_power_w"]
        settled = before is not None and power >= before - max(1.0, 0.02 * before)
        waited = time.monotonic() - t0
        if settled or waited + seconds > settle_s:
            break
        before = power
    return {"gpu_idle_power_w": power, "gpu_idle_window_s": summary["window_s"], "gpu_idle_settled": settled,
            "gpu_idle_wait_s": round(waited, 1),
            "gpu_idle_per_gpu": [{k: r[k] for k in ("index", "name", "power_w_mean") if k in r}
                                 for r in summary["per_gpu"]]}


def above_idle(per_token_j: float | None, power_w: float | None, idle_w: float | None) -> float | None:
    """Energy per token above what the GPUs draw idle: the window's energy per token times the share of its
    mean power above the idle power (both over the server's GPUs)."""
    if per_token_j is None or not power_w or idle_w is None:
        return None
    return per_token_j * max(0.0, power_w - idle_w) / power_w


def peak_bandwidth_tb_s(gpu_name: str | None) -> float | None:
    """The GPU's peak memory bandwidth (TB/s) from data/gpu_peaks.yaml, matched on NVML's name."""
    if not gpu_name:
        return None
    peaks = yaml.safe_load(PEAKS_FILE.read_text())["gpus"]
    name = gpu_name.lower()
    best = None
    for entry in peaks:
        if all(part.lower() in name for part in entry["match"]):
            if best is None or len(entry["match"]) > len(best["match"]):
                best = entry
    return float(best["memory_bandwidth_tb_s"]) if best else None


def roofline(weight_gib_per_gpu: float | None, gpu_name: str | None, measured_ms_per_token: float | None
             ) -> dict[str, Any] | None:
    """Decode at concurrency 1: the memory-bandwidth bound per token against the measured time."""
    bw = peak_bandwidth_tb_s(gpu_name)
    if not weight_gib_per_gpu or not bw or not measured_ms_per_token:
        return None
    bound_ms = weight_gib_per_gpu * 2**30 / (bw * 1e12) * 1000.0
    return {"roofline_bound_ms": round(bound_ms, 4), "roofline_peak_bw_tb_s": bw,
            "roofline_weight_gib": weight_gib_per_gpu,
            "roofline_pct": round(100.0 * bound_ms / measured_ms_per_token, 2)}
