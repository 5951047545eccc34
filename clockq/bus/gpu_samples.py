"""The latest GPU sample of every GPU in the cluster, shared through Redis.

Each GPU worker publishes its newest `GpuSample` under `clockq:gpu:<host>:<index>` with a 15 s
TTL, so a host that stops publishing drops out by itself. /api/gpus and /healthz read them.
The samples come from other hosts and may be anything: `GpuSample.from_dict` validates them.
Taking a sample (NVML, simulated GPUs) is the workers' business, not this module's.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import redis

from clockq.ratelimit import RateLimitedWarnings

log = logging.getLogger("clockq.telemetry")

KEY_PREFIX = "clockq:gpu:"
TTL_S = 15
MAX_ERROR_CHARS = 500


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
        self.warnings = warnings or RateLimitedWarnings(log, clock=clock)
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
