"""GPU telemetry: sample a GPU through NVML (or a simulated one) while a slice runs, and share it.

- `GpuSample` is one reading of one GPU: the spec's ten-plus dimensions (GPU and memory-controller
  utilisation, memory used/total, PCIe TX/RX, SM clock, power, temperature, compute processes)
  plus the host's CPU and memory load.
- `NvmlProbe` reads a real GPU. It never raises: a query that fails (no driver, GPU fallen off
  the bus, a counter this GPU does not support) leaves that field None and says why in `error`,
  with a warning logged at most once a minute per distinct text. A host without NVML gets samples
  that carry the init error; it is never silently switched to simulated.
- `SimulatedProbe` reports what the running workload declares (`set_load`), deterministically, so
  everything above it runs unchanged on machines without GPUs.
- `SliceSampler` samples in one long-lived background thread, armed and disarmed per slice.
- `publish` / `cluster_samples` / `Publisher` share the latest sample of each GPU through Redis
  (`clockq:gpu:<host>:<index>`, 15 s TTL), for /api/gpus.

NVML notes: utilisation is averaged by the driver over its own sample period (1/6 s to 1 s), so
it lags a 20-50 ms slice. `nvmlDeviceGetPcieThroughput` blocks for 20 ms per counter, so the PCIe
pair is refreshed at most once per `pcie_interval_s` and only on `sample(include_slow=True)`; other
samples reuse the last reading.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

import psutil
import pynvml
import redis

log = logging.getLogger("clockq.telemetry")

KEY_PREFIX = "clockq:gpu:"
TTL_S = 15
LOG_EVERY_S = 60.0
NVML_RETRY_S = 60.0  # how often a failed nvmlInit / handle lookup is tried again
MAX_ERROR_CHARS = 500
MIB = 2**20

HOSTNAME = socket.gethostname()


# --------------------------------------------------------------------------------------------
# The sample


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU. Metric fields are None where the reading failed or is unknown."""

    host: str
    gpu_index: int
    ts: float  # time.time()
    simulated: bool
    gpu_util: float | None = None  # 0..1, SM busy
    mem_util: float | None = None  # 0..1, memory controller busy (memory bandwidth)
    mem_used_mib: int | None = None
    mem_total_mib: int | None = None
    pcie_tx_kbps: int | None = None  # KB/s
    pcie_rx_kbps: int | None = None  # KB/s
    sm_clock_mhz: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    process_count: int | None = None  # compute processes on this GPU
    host_cpu: float | None = None  # 0..1
    host_mem: float | None = None  # 0..1
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> GpuSample:
        """Validate and build a sample from untrusted data (another host's Redis entry).
        Unknown keys are ignored; a missing metric is None; anything malformed raises ValueError."""
        if not isinstance(data, dict):
            raise ValueError(f"a GPU sample must be an object, not {type(data).__name__}")
        values: dict[str, Any] = {}
        for name, (check, required) in _FIELD_CHECKS.items():
            if name not in data or data[name] is None:
                if required:
                    raise ValueError(f"GPU sample field {name!r} is missing")
                values[name] = None
                continue
            try:
                values[name] = check(data[name])
            except (TypeError, ValueError) as exc:
                raise ValueError(f"GPU sample field {name!r}: {exc}") from None
        return cls(**values)


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError("not a finite number")
    return value


def _non_negative(value: Any) -> float:
    value = _number(value)
    if value < 0:
        raise ValueError("negative")
    return value


def _fraction(value: Any) -> float:
    value = _number(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{value} is outside 0..1")
    return value


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    if value < 0:
        raise ValueError("negative")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a boolean, got {type(value).__name__}")
    return value


def _text(limit: int) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {type(value).__name__}")
        if len(value) > limit:
            raise ValueError(f"longer than {limit} characters")
        return value

    return check


def _host(value: Any) -> str:
    value = _text(255)(value)
    if not value:
        raise ValueError("empty")
    return value


# field -> (validator, required)
_FIELD_CHECKS: dict[str, tuple[Callable[[Any], Any], bool]] = {
    "host": (_host, True),
    "gpu_index": (_count, True),
    "ts": (_non_negative, True),
    "simulated": (_bool, True),
    "gpu_util": (_fraction, False),
    "mem_util": (_fraction, False),
    "mem_used_mib": (_count, False),
    "mem_total_mib": (_count, False),
    "pcie_tx_kbps": (_count, False),
    "pcie_rx_kbps": (_count, False),
    "sm_clock_mhz": (_count, False),
    "power_w": (_non_negative, False),
    "temperature_c": (_number, False),
    "process_count": (_count, False),
    "host_cpu": (_fraction, False),
    "host_mem": (_fraction, False),
    "error": (_text(2 * MAX_ERROR_CHARS), False),
}
assert set(_FIELD_CHECKS) == {f.name for f in fields(GpuSample)}


def _host_load() -> tuple[float | None, float | None]:
    """Host CPU (since the previous call in this process) and memory load, 0..1."""
    try:
        cpu = round(min(max(psutil.cpu_percent(None) / 100.0, 0.0), 1.0), 4)
        mem = round(min(max(psutil.virtual_memory().percent / 100.0, 0.0), 1.0), 4)
    except Exception:  # psutil failing must not cost us the GPU reading
        return None, None
    return cpu, mem


# --------------------------------------------------------------------------------------------
# Rate-limited warnings


class RateLimitedWarnings:
    """Log each distinct text at WARNING at most once per `every_s`."""

    MAX_TEXTS = 256

    def __init__(
        self, logger: logging.Logger = log, every_s: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic
    ):
        self.logger = logger
        self.every_s = every_s
        self.clock = clock
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def warn(self, text: str) -> bool:
        """Log `text` unless it was logged less than `every_s` ago. True if it was logged."""
        now = self.clock()
        with self._lock:
            last = self._last.get(text)
            if last is not None and now - last < self.every_s:
                return False
            if len(self._last) >= self.MAX_TEXTS:
                self._last = {t: at for t, at in self._last.items() if now - at < self.every_s}
            self._last[text] = now
        self.logger.warning("%s", text)
        return True


# --------------------------------------------------------------------------------------------
# NVML


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

    def reset(self) -> None:
        """Forget the init state (tests; after a driver reload). Does not call nvmlShutdown."""
        with self._lock:
            self._pid, self._error, self._failed_at = None, None, -math.inf


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
        self.warnings = warnings or RateLimitedWarnings()
        self._lock = threading.Lock()
        self._handle: Any = None
        self._open_error: str | None = None
        self._open_tried_at = -math.inf
        # (tx, rx, errors) from the last PCIe refresh, and when it was taken
        self._pcie: tuple[int | None, int | None, tuple[str, ...]] = (None, None, ())
        self._pcie_at = -math.inf
        self._open()

    @property
    def open_error(self) -> str | None:
        """Why there is no device handle (NVML init or handle lookup failed), else None."""
        return self._open_error if self._handle is None else None

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
            host=HOSTNAME,
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
            host=HOSTNAME,
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


def nvml_status() -> dict[str, Any]:
    """For /healthz: {"available", "error", "driver", "gpus"}. Never raises."""
    error = _nvml.ensure()
    if error is None:
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            count = int(pynvml.nvmlDeviceGetCount())
        except Exception as exc:
            error = f"NVML query failed: {_describe(exc)}"
        else:
            if isinstance(driver, bytes):
                driver = driver.decode(errors="replace")
            return {"available": True, "error": None, "driver": str(driver), "gpus": count}
    return {"available": False, "error": _short(error), "driver": None, "gpus": 0}


# --------------------------------------------------------------------------------------------
# Sampling while a slice runs


@dataclass(frozen=True)
class SliceStats:
    samples: int
    mean_gpu_util: float | None  # None when no sample had a utilisation reading
    max_gpu_util: float | None
    mean_mem_util: float | None
    peak_mem_used_mib: int | None
    errors: int  # samples that carried an error
    last: GpuSample


class _Accumulator:
    __slots__ = ("count", "errors", "last", "max_util", "mem_n", "mem_sum", "peak_mem", "util_n", "util_sum")

    def __init__(self) -> None:
        self.count = self.errors = self.util_n = self.mem_n = 0
        self.util_sum = self.mem_sum = 0.0
        self.max_util: float | None = None
        self.peak_mem: int | None = None
        self.last: GpuSample | None = None

    def add(self, s: GpuSample) -> None:
        self.count += 1
        self.last = s
        if s.error:
            self.errors += 1
        if s.gpu_util is not None:
            self.util_n += 1
            self.util_sum += s.gpu_util
            self.max_util = s.gpu_util if self.max_util is None else max(self.max_util, s.gpu_util)
        if s.mem_util is not None:
            self.mem_n += 1
            self.mem_sum += s.mem_util
        if s.mem_used_mib is not None:
            self.peak_mem = s.mem_used_mib if self.peak_mem is None else max(self.peak_mem, s.mem_used_mib)

    def stats(self) -> SliceStats:
        assert self.last is not None
        return SliceStats(
            samples=self.count,
            mean_gpu_util=self.util_sum / self.util_n if self.util_n else None,
            max_gpu_util=self.max_util,
            mean_mem_util=self.mem_sum / self.mem_n if self.mem_n else None,
            peak_mem_used_mib=self.peak_mem,
            errors=self.errors,
            last=self.last,
        )


class SliceSampler:
    """Samples `probe` every `interval_s` between `start()` and `stop()`, in one long-lived daemon
    thread that is armed and disarmed per slice (no thread per slice). start/stop cost the caller
    a lock and an Event each; stop() samples once itself only if the thread took no sample."""

    def __init__(self, probe: Probe, interval_s: float = 0.01):
        if not interval_s > 0:
            raise ValueError("interval_s must be positive")
        self.probe = probe
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._armed = threading.Event()
        self._kick = threading.Event()  # wakes the thread early: a new slice, or close()
        self._epoch = 0
        self._acc = _Accumulator()
        self._latest: GpuSample | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._armed.is_set()

    @property
    def samples_taken(self) -> int:
        """Samples taken so far in the current (or last) slice."""
        return self._acc.count

    @property
    def latest(self) -> GpuSample | None:
        """The newest sample from any slice (for publishing), or None before the first."""
        return self._latest

    def start(self) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("SliceSampler is closed")
            if self._armed.is_set():
                raise RuntimeError("SliceSampler already started")
            self._epoch += 1
            self._acc = _Accumulator()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name=f"clockq-telemetry-gpu{self.probe.gpu_index}", daemon=True
                )
                self._thread.start()
            self._armed.set()
            self._kick.set()

    def stop(self) -> SliceStats:
        with self._lock:
            if not self._armed.is_set():
                raise RuntimeError("SliceSampler not started")
            self._armed.clear()
            self._epoch += 1
            acc = self._acc
        if acc.count == 0:  # a slice shorter than the first sample: take one here
            sample = self.probe.sample(include_slow=False)
            acc.add(sample)
            self._latest = sample
        return acc.stats()

    def close(self, timeout: float = 1.0) -> None:
        with self._lock:
            self._closed = True
            self._armed.clear()
            thread = self._thread
        self._kick.set()
        self._armed.set()  # let a waiting thread see _closed
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            self._armed.wait()
            if self._closed:
                return
            self._kick.clear()
            epoch = self._epoch
            try:
                sample = self.probe.sample()
            except Exception:  # a probe should never raise; keep the thread alive if one does
                log.exception("GPU %s telemetry probe raised", self.probe.gpu_index)
                sample = None
            if sample is not None:
                with self._lock:
                    if epoch == self._epoch and self._armed.is_set():
                        self._acc.add(sample)
                        self._latest = sample
            self._kick.wait(self.interval_s)

    def __enter__(self) -> SliceSampler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# Sharing through Redis


def sample_key(host: str, gpu_index: int) -> str:
    return f"{KEY_PREFIX}{host}:{gpu_index}"


def publish(client: redis.Redis, sample: GpuSample, ttl_s: int = TTL_S, *, only_if_absent: bool = False) -> None:
    """SET this GPU's latest sample with a short TTL, so dead hosts disappear by themselves.

    `only_if_absent` is for the idle heartbeat: it must not overwrite the fresher samples that
    the process running a slice publishes."""
    payload = json.dumps(sample.to_dict(), separators=(",", ":"), allow_nan=False)
    client.set(sample_key(sample.host, sample.gpu_index), payload, ex=ttl_s, nx=only_if_absent)


def cluster_samples(client: redis.Redis, scan_count: int = 500) -> list[GpuSample]:
    """The latest sample of every GPU in the cluster, sorted by (host, index). Entries that do
    not parse are skipped (logged at debug): they come from other hosts and may be anything."""
    keys = sorted({k for k in client.scan_iter(match=f"{KEY_PREFIX}*", count=scan_count)})
    samples = []
    for start in range(0, len(keys), scan_count):
        chunk = keys[start : start + scan_count]
        for key, raw in zip(chunk, client.mget(chunk), strict=True):
            if raw is None:  # expired between SCAN and MGET
                continue
            try:
                samples.append(GpuSample.from_dict(json.loads(raw)))
            except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
                log.debug("skipping bad GPU sample at %r: %s", key, exc)
    samples.sort(key=lambda s: (s.host, s.gpu_index))
    return samples


class Publisher:
    """Publish at most once per `min_interval_s`; a Redis error is swallowed, warned about at
    most once a minute, and backs off for `error_backoff_s` so a dead broker costs little."""

    def __init__(
        self,
        client: redis.Redis,
        min_interval_s: float = 1.0,
        *,
        ttl_s: int = TTL_S,
        error_backoff_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        warnings: RateLimitedWarnings | None = None,
    ):
        self.client = client
        self.min_interval_s = min_interval_s
        self.ttl_s = ttl_s
        self.error_backoff_s = error_backoff_s
        self.clock = clock
        self.warnings = warnings or RateLimitedWarnings(clock=clock)
        self._next_at = -math.inf

    def maybe_publish(self, sample: GpuSample | None) -> bool:
        """True if the sample was written now."""
        if sample is None:
            return False
        now = self.clock()
        if now < self._next_at:
            return False
        try:
            publish(self.client, sample, self.ttl_s)
        except redis.RedisError as exc:
            self._next_at = now + max(self.min_interval_s, self.error_backoff_s)
            self.warnings.warn(f"could not publish GPU telemetry: {type(exc).__name__}: {exc}")
            return False
        self._next_at = now + self.min_interval_s
        return True
