"""GPU telemetry's summary and the decode roofline; NVML's absence costs nothing.

The sampler is exercised against ``StubNVML``, a stand-in for the pynvml module
with two GPUs whose counters follow a script, so the arithmetic can be checked
on a machine without a GPU (the real NVML is exercised by the H200 run).
"""

from __future__ import annotations

import sys
import time
import types

import pytest

from speedmatrix.measure import telemetry


class StubNVML(types.ModuleType):
    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self):
        super().__init__("pynvml")
        self.energy = {0: 1_000_000, 1: 2_000_000}  # mJ

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H200"

    def nvmlDeviceGetPowerUsage(self, h):
        return 300_000 + 100_000 * h  # mW: 300 W and 400 W

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.energy[h] += 50_000 * (h + 1)  # +50 J / +100 J a reading
        return self.energy[h]

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=90 + h, memory=40)

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980 if kind == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetPcieThroughput(self, h, kind):
        return 8_000_000 if kind == self.NVML_PCIE_UTIL_RX_BYTES else 6_000_000  # KB/s

    def nvmlDeviceGetTemperature(self, h, kind):
        return 50 + 10 * h


@pytest.fixture
def stub_nvml(monkeypatch):
    stub = StubNVML()
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    return stub


def test_summary_per_gpu_and_total(stub_nvml):
    s = telemetry.Sampler(interval_s=0.01)
    s.start()
    time.sleep(0.1)
    out = s.stop(output_tokens=1000)
    n = min(g["samples"] for g in out["per_gpu"])
    assert n >= 2 and out["gpu_count"] == 2 and out["gpu_name"] == "NVIDIA H200"
    assert out["gpu_power_w"] == 700.0  # summed over the GPUs
    gpu0, gpu1 = out["per_gpu"]
    assert gpu0["energy_j"] == pytest.approx(50.0 * (gpu0["samples"] - 1))  # the counter's change, first to last
    assert gpu1["energy_j"] == pytest.approx(100.0 * (gpu1["samples"] - 1))
    assert out["gpu_energy_per_output_token_j"] == pytest.approx(out["gpu_energy_j"] / 1000)
    assert out["gpu_sm_util_pct"] == 90.5 and out["gpu_pcie_rx_mb_s"] == 16_000.0  # 8 GB/s a GPU, two GPUs
    assert out["gpu_temp_c_max"] == 60 and out["gpu_sm_clock_mhz"] == 1980


def test_server_visible_devices_choose_the_gpus(stub_nvml):
    s = telemetry.Sampler(interval_s=0.01, env={"CUDA_VISIBLE_DEVICES": "1"})
    s.start()
    time.sleep(0.05)
    out = s.stop()
    assert [g["index"] for g in out["per_gpu"]] == [1] and out["gpu_power_w"] == 400.0


def test_without_nvml_nothing_is_sampled(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails, as on the CPU default
    s = telemetry.Sampler()
    s.start()
    assert not s.available and s.stop(100) is None


def test_roofline_against_the_datasheet_bandwidth():
    # 56.6 GiB of BF16 weights (Gemma-4-31B's shape) on an H200 (4.8 TB/s): 12.66 ms a token at best
    r = telemetry.roofline(56.6, "NVIDIA H200", 17.7)
    assert r["roofline_bound_ms"] == pytest.approx(56.6 * 2**30 / 4.8e12 * 1e3, rel=1e-4)
    assert r["roofline_pct"] == pytest.approx(100 * r["roofline_bound_ms"] / 17.7, rel=1e-3)
    assert telemetry.peak_bandwidth_tb_s("NVIDIA H100 PCIe") == 2.0  # the longest match wins
    assert telemetry.roofline(56.6, "Some Unknown GPU", 17.7) is None
    assert telemetry.roofline(None, "NVIDIA H200", 17.7) is None


def test_idle_power_before_a_server_and_the_energy_above_it(stub_nvml):
    idle = telemetry.idle_power({"CUDA_VISIBLE_DEVICES": "0"}, seconds=0.2)
    assert idle["gpu_idle_power_w"] == 300.0 and [g["index"] for g in idle["gpu_idle_per_gpu"]] == [0]
    assert idle["gpu_idle_settled"] is True  # two windows alike
    # a window at 400 W of which 300 W is idle: a quarter of each token's energy was the serving's
    assert telemetry.above_idle(2.0, 400.0, 300.0) == pytest.approx(0.5)
    assert telemetry.above_idle(2.0, 250.0, 300.0) == 0.0  # below idle (a cooler GPU): nothing above it
    assert telemetry.above_idle(2.0, 400.0, None) is None  # no idle reading (an older run): no figure


def test_idle_power_waits_for_a_gpu_another_server_just_left(stub_nvml, monkeypatch):
    """A GPU whose power still falls (a server stopped a moment ago) is sampled until it stops falling: the
    reading is the settled one, not the warm GPU's; one that keeps falling past the limit is said to be
    unsettled."""
    falling = iter([120_000] * 3 + [100_000] * 3 + [80_000] * 3 + [77_000] * 100)
    monkeypatch.setattr(stub_nvml, "nvmlDeviceGetPowerUsage", lambda h: next(falling, 77_000), raising=False)
    idle = telemetry.idle_power({"CUDA_VISIBLE_DEVICES": "0"}, seconds=0.05)
    assert idle["gpu_idle_power_w"] == pytest.approx(77.0, abs=1.5) and idle["gpu_idle_settled"] is True
    power = iter(range(500_000, 0, -10_000))
    monkeypatch.setattr(stub_nvml, "nvmlDeviceGetPowerUsage", lambda h: next(power), raising=False)
    idle = telemetry.idle_power({"CUDA_VISIBLE_DEVICES": "0"}, seconds=0.05, settle_s=0.2)
    assert idle["gpu_idle_settled"] is False and idle["gpu_idle_wait_s"] <= 0.3


def test_without_nvml_there_is_no_idle_reading(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert telemetry.idle_power(seconds=0.01) is None
