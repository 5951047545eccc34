"""Reading a GPU: NVML (with its failures injected, so every machine runs the same checks) and
simulated GPUs."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from workers import probes
from workers.probes import NvmlProbe, SimulatedProbe, make_probe

MIB = 2**20


@pytest.fixture
def fake_nvml(monkeypatch):
    """A healthy GPU behind the NVML calls the probe makes. Tests break single calls on top."""
    calls: list[str] = []

    def answer(name, value):
        def query(*args):
            calls.append(name)
            return value

        monkeypatch.setattr(pynvml, name, query)

    monkeypatch.setattr(probes, "_nvml", probes._NvmlLibrary())
    answer("nvmlInit", None)
    answer("nvmlDeviceGetHandleByIndex", object())
    answer("nvmlDeviceGetUtilizationRates", SimpleNamespace(gpu=87, memory=41))
    answer("nvmlDeviceGetMemoryInfo", SimpleNamespace(used=30_000 * MIB, total=81_559 * MIB, free=51_559 * MIB))
    answer("nvmlDeviceGetClockInfo", 1980)
    answer("nvmlDeviceGetPowerUsage", 412_500)
    answer("nvmlDeviceGetTemperature", 61)
    answer("nvmlDeviceGetComputeRunningProcesses", [object(), object()])
    answer("nvmlDeviceGetPcieThroughput", 1234)
    return calls


def test_nvml_probe_reads_every_dimension_of_a_healthy_gpu(fake_nvml):
    s = NvmlProbe(2).sample()
    assert not s.simulated and s.error is None and s.gpu_index == 2 and s.host
    assert (s.gpu_util, s.mem_util) == (0.87, 0.41)
    assert (s.mem_used_mib, s.mem_total_mib) == (30_000, 81_559)
    assert (s.sm_clock_mhz, s.power_w, s.temperature_c, s.process_count) == (1980, 412.5, 61.0, 2)
    assert (s.pcie_tx_kbps, s.pcie_rx_kbps) == (1234, 1234)
    assert s.host_cpu is not None and s.host_mem is not None
    assert NvmlProbe(2).free_memory_mib() == 51_559


def test_nvml_probe_without_a_driver_reports_the_error_and_logs_it_once(no_nvml, telemetry_log):
    probe = NvmlProbe(0)
    samples = [probe.sample() for _ in range(20)]
    for s in samples:
        assert s.error == "NVML unavailable: NVML Shared Library Not Found" and not s.simulated
        assert s.gpu_util is None and s.mem_total_mib is None and s.power_w is None
        assert s.host and s.gpu_index == 0 and s.host_mem is not None
    assert probe.free_memory_mib() is None
    assert telemetry_log.warnings == ["GPU 0 telemetry: NVML unavailable: NVML Shared Library Not Found"]


def test_a_real_gpu_whose_nvml_fails_is_never_switched_to_simulated(no_nvml):
    probe = make_probe(3, simulated=False, memory_total_mib=8192)
    assert isinstance(probe, NvmlProbe) and not probe.simulated
    s = probe.sample()
    assert s.error and s.gpu_index == 3 and s.gpu_util is None


def test_each_failing_nvml_query_leaves_its_field_empty_and_names_itself(fake_nvml, monkeypatch):
    def not_supported(*args):
        raise pynvml.NVMLError_NotSupported()

    def gpu_lost(*args):
        raise pynvml.NVMLError_GpuIsLost()

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", not_supported)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPcieThroughput", not_supported)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", gpu_lost)
    probe = NvmlProbe(0)
    s = probe.sample()
    assert s.error == "power: Not Supported; temperature: GPU is lost; pcie tx: Not Supported; pcie rx: Not Supported"
    assert s.power_w is None and s.temperature_c is None and s.pcie_tx_kbps is None and s.pcie_rx_kbps is None
    # Every other query still ran and filled its field.
    assert s.gpu_util == 0.87 and s.mem_total_mib == 81_559 and s.sm_clock_mhz == 1980 and s.process_count == 2

    # The slow PCIe pair is not queried again within its interval, but its error is still reported.
    fake_nvml.clear()
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPcieThroughput", lambda *a: fake_nvml.append("pcie"))
    again = probe.sample()
    assert "pcie" not in fake_nvml and "pcie tx: Not Supported" in again.error


def test_a_probe_never_raises_even_on_unexpected_errors(fake_nvml, monkeypatch):
    probe = NvmlProbe(0)
    monkeypatch.setattr(probe, "_open", lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert probe.sample().error == "telemetry failed: RuntimeError('boom')"


def test_simulated_probe_reports_the_declared_load():
    probe = make_probe(1, simulated=True, memory_total_mib=8192)
    assert isinstance(probe, SimulatedProbe)
    idle = probe.sample()
    assert idle.simulated and idle.error is None and idle.gpu_index == 1
    assert idle.gpu_util == 0.0 and idle.process_count == 0 and idle.sm_clock_mhz == 210
    assert idle.power_w == 60.0 and idle.temperature_c == 35.0 and idle.mem_total_mib == 8192
    probe.set_load(0.75, mem_used_mib=3000)
    busy = probe.sample()
    assert busy.gpu_util == 0.75 and busy.mem_util == pytest.approx(0.45)
    assert busy.power_w == pytest.approx(240.0) and busy.temperature_c == pytest.approx(65.0)
    assert busy.sm_clock_mhz == 1980 and busy.process_count == 1 and busy.mem_used_mib == 3000
    assert probe.free_memory_mib() == 5192
    # Deterministic: the same load gives the same GPU readings.
    again = probe.sample()
    gpu_fields = ("gpu_util", "mem_util", "mem_used_mib", "pcie_tx_kbps", "power_w", "temperature_c")
    assert [getattr(again, f) for f in gpu_fields] == [getattr(busy, f) for f in gpu_fields]
    probe.set_load(None)
    assert probe.sample().gpu_util == 0.0 and probe.free_memory_mib() == 8192
    probe.set_load(0.5, mem_used_mib=10**9)  # clamped to the GPU's memory
    assert probe.free_memory_mib() == 0
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError):
            probe.set_load(bad)
