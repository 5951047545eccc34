"""Read a GPU: through NVML, or a simulated one on machines without GPUs.

- `NvmlProbe` reads a real GPU: the spec's ten-plus dimensions (GPU and memory-controller
  utilisation, memory used/total, PCIe TX/RX, SM clock, power, temperature, compute processes)
  plus the host's CPU and memory load. It never raises: a query that fails (no driver, GPU
  fallen off the bus, a counter this GPU does not support) leaves that field None and says why
  in `error`, with a warning logged at most once a minute per distinct text. A host without
  NVML gets samples that carry the init error; it is never silently switched to simulated.
- `SimulatedProbe` reports what the running workload declares (`set_load`), deterministically,
  so everything above it runs unchanged on machines without GPUs.

NVML notes: utilisation is averaged by the driver over its own sample period (1/6 s to 1 s), so
it lags a 20-50 ms slice. `nvmlDeviceGetPcieThroughput` blocks for 20 ms per counter, so the PCIe
pair is refreshed at most once per `pcie_interval_s` and only on `sample(include_slow=True)`; other
samples reuse the last reading.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import psutil
import pynvml
from django.conf import settings

from clockq.bus.gpu_samples import MAX_ERROR_CHARS, GpuSample
from clockq.ratelimit import RateLimitedWarnings

log = logging.getLogger("clockq.telemetry")

NVML_RETRY_S = 60.0  # how often a failed nvmlInit / handle lookup is tried again
MIB = 2**20


def _host_load() -> tuple[float | None, float | None]:
    """Host CPU (since the previous call in this process) and memory load, 0..1."""
    try:
        cpu = round(min(max(psutil.cpu_percent(None) / 100.0, 0.0), 1.0), 4)
        mem = round(min(max(psutil.virtual_memory().percent / 100.0, 0.0), 1.0), 4)
    except Exception:  # psutil failing must not cost us the GPU reading
        return None, None
    return cpu, mem


class _NvmlLibrary:
    """nvmlInit once per process (re-done after a fork). A failure is remembered and retried
    at most every NVML_RETRY_S, so a GPU-less host does not retry on every sample."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._error: str | None = None
        self._failed_at = -math.inf

    def ensure(self) -> str | None:
        """None when NVML is initialised in this process, else why not."""
        pid = os.getpid()
        if self._pid == pid and self._error is None:
            return None
        with self._lock:
            if self._pid == pid:
                if self._error is None:
                    return None
                if time.monotonic() - self._failed_at < NVML_RETRY_S:
                    return self._error
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                self._pid, self._error, self._failed_at = pid, f"NVML unavailable: {exc}", time.monotonic()
            except Exception as exc:  # e.g. OSError from a broken library
                self._pid, self._error, self._failed_at = pid, f"NVML unavailable: {exc!r}", time.monotonic()
            else:
                self._pid, self._error = pid, None
            return self._error


_nvml = _NvmlLibrary()


def _short(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, pynvml.NVMLError) else repr(exc)


class Probe(Protocol):
    gpu_index: int
    simulated: bool

    def sample(self, include_slow: bool = True) -> GpuSample: ...

    def free_memory_mib(self) -> int | None: ...


class NvmlProbe:
    """A real GPU, by NVML index. Never raises from `sample` or `free_memory_mib`."""

    simulated = False

    def __init__(
        self,
        gpu_index: int,
        *,
        pcie_interval_s: float = 1.0,
        warnings: RateLimitedWarnings | None = None,
    ):
        if isinstance(gpu_index, bool) or not isinstance(gpu_index, int) or gpu_index < 0:
            raise ValueError(f"gpu_index must be a non-negative integer, not {gpu_index!r}")
        self.gpu_index = gpu_index
        self.pcie_interval_s = pcie_interval_s
        self.warnings = warnings or RateLimitedWarnings(log)
        self._lock = threading.Lock()
        self._handle: Any = None
        self._open_error: str | None = None
        self._open_tried_at = -math.inf
        # (tx, rx, errors) from the last PCIe refresh, and when it was taken
        self._pcie: tuple[int | None, int | None, tuple[str, ...]] = (None, None, ())
        self._pcie_at = -math.inf
        self._open()

    def _open(self) -> tuple[Any, str | None]:
        if self._handle is not None:
            return self._handle, None
        with self._lock:
            if self._handle is not None:
                return self._handle, None
            if self._open_error is not None and time.monotonic() - self._open_tried_at < NVML_RETRY_S:
                return None, self._open_error
            self._open_tried_at = time.monotonic()
            error = _nvml.ensure()
            if error is None:
                try:
                    self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.gpu_index)
                except Exception as exc:
                    error = f"NVML has no GPU {self.gpu_index}: {_describe(exc)}"
            self._open_error = _short(error) if error else None
            return self._handle, self._open_error

    def sample(self, include_slow: bool = True) -> GpuSample:
        """Read the GPU now. `include_slow=False` skips the 40 ms PCIe refresh (reusing the last
        reading), for callers on a latency-critical path."""
        ts = time.time()
        host_cpu, host_mem = _host_load()
        try:
            handle, error = self._open()
            if handle is None:
                values: dict[str, Any] = {}
                error = error or "NVML unavailable"
            else:
                values, errors = self._read(handle, include_slow)
                error = _short("; ".join(errors)) if errors else None
        except Exception as exc:  # never raise, whatever NVML or ctypes does
            values, error = {}, _short(f"telemetry failed: {exc!r}")
        if error:
            self.warnings.warn(f"GPU {self.gpu_index} telemetry: {error}")
        return GpuSample(
            host=settings.CLOCKQ_HOST,
            gpu_index=self.gpu_index,
            ts=ts,
            simulated=False,
            host_cpu=host_cpu,
            host_mem=host_mem,
            error=error,
            **values,
        )

    def _read(self, handle: Any, include_slow: bool) -> tuple[dict[str, Any], list[str]]:
        errors: list[str] = []

        def query(label: str, fn: Callable[..., Any], *args: Any) -> Any:
            try:
                return fn(handle, *args)
            except Exception as exc:
                errors.append(f"{label}: {_describe(exc)}")
                return None

        values: dict[str, Any] = {}
        util = query("utilization", pynvml.nvmlDeviceGetUtilizationRates)
        if util is not None:
            values["gpu_util"] = min(util.gpu / 100.0, 1.0)
            values["mem_util"] = min(util.memory / 100.0, 1.0)
        memory = query("memory", pynvml.nvmlDeviceGetMemoryInfo)
        if memory is not None:
            values["mem_used_mib"] = int(memory.used) // MIB
            values["mem_total_mib"] = int(memory.total) // MIB
        values["sm_clock_mhz"] = query("sm clock", pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM)
        power_mw = query("power", pynvml.nvmlDeviceGetPowerUsage)
        values["power_w"] = power_mw / 1000.0 if power_mw is not None else None
        temperature = query("temperature", pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU)
        values["temperature_c"] = float(temperature) if temperature is not None else None
        processes = query("processes", pynvml.nvmlDeviceGetComputeRunningProcesses)
        values["process_count"] = len(processes) if processes is not None else None

        now = time.monotonic()
        if include_slow and now - self._pcie_at >= self.pcie_interval_s:
            self._pcie_at = now
            before = len(errors)
            tx = query("pcie tx", pynvml.nvmlDeviceGetPcieThroughput, pynvml.NVML_PCIE_UTIL_TX_BYTES)
            rx = query("pcie rx", pynvml.nvmlDeviceGetPcieThroughput, pynvml.NVML_PCIE_UTIL_RX_BYTES)
            self._pcie = (tx, rx, tuple(errors[before:]))
        else:
            errors.extend(self._pcie[2])
        values["pcie_tx_kbps"], values["pcie_rx_kbps"] = self._pcie[0], self._pcie[1]
        return values, errors

    def free_memory_mib(self) -> int | None:
        try:
            handle, _error = self._open()
            if handle is None:
                return None
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).free) // MIB
        except Exception as exc:
            self.warnings.warn(f"GPU {self.gpu_index} telemetry: memory: {_describe(exc)}")
            return None


# --------------------------------------------------------------------------------------------
# Simulated GPUs


class SimulatedProbe:
    """A GPU that reports what the running workload declares. Deterministic: no randomness."""

    simulated = True
    BUSY_SM_CLOCK_MHZ = 1980
    IDLE_SM_CLOCK_MHZ = 210

    def __init__(self, gpu_index: int, memory_total_mib: int = 16384):
        if isinstance(gpu_index, bool) or not isinstance(gpu_index, int) or gpu_index < 0:
            raise ValueError(f"gpu_index must be a non-negative integer, not {gpu_index!r}")
        if isinstance(memory_total_mib, bool) or not isinstance(memory_total_mib, int) or memory_total_mib <= 0:
            raise ValueError(f"memory_total_mib must be a positive integer, not {memory_total_mib!r}")
        self.gpu_index = gpu_index
        self.memory_total_mib = memory_total_mib
        self._load: tuple[float | None, int] = (None, 0)  # replaced whole, so readers see a consistent pair

    def set_load(self, util: float | None, mem_used_mib: int = 0) -> None:
        """What the running workload declares: utilisation 0..1, or None when idle."""
        if util is not None:
            util = float(util)
            if not 0.0 <= util <= 1.0:  # also refuses NaN
                raise ValueError(f"util must be in 0..1 or None, not {util!r}")
        mem = min(max(int(mem_used_mib), 0), self.memory_total_mib)
        self._load = (util, mem)

    def sample(self, include_slow: bool = True) -> GpuSample:
        util, mem_used = self._load
        busy = util is not None
        u = util or 0.0
        host_cpu, host_mem = _host_load()
        return GpuSample(
            host=settings.CLOCKQ_HOST,
            gpu_index=self.gpu_index,
            ts=time.time(),
            simulated=True,
            gpu_util=u,
            mem_util=round(0.6 * u, 4),
            mem_used_mib=mem_used,
            mem_total_mib=self.memory_total_mib,
            pcie_tx_kbps=round(2000 * u),
            pcie_rx_kbps=round(8000 * u),
            sm_clock_mhz=self.BUSY_SM_CLOCK_MHZ if busy else self.IDLE_SM_CLOCK_MHZ,
            power_w=round(60.0 + 240.0 * u, 3),
            temperature_c=round(35.0 + 40.0 * u, 3),
            process_count=1 if busy else 0,
            host_cpu=host_cpu,
            host_mem=host_mem,
            error=None,
        )

    def free_memory_mib(self) -> int:
        return self.memory_total_mib - self._load[1]


def make_probe(gpu_index: int, simulated: bool, memory_total_mib: int | None = None) -> NvmlProbe | SimulatedProbe:
    """The probe for a worker's GPU. A real GPU whose NVML fails gets an NvmlProbe anyway, so its
    samples show the error rather than pretending all is well."""
    if simulated:
        return SimulatedProbe(gpu_index, memory_total_mib if memory_total_mib is not None else 16384)
    return NvmlProbe(gpu_index)
