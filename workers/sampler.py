"""Sample a worker's GPU while a slice runs, in one long-lived thread armed per slice."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from clockq.bus.gpu_samples import GpuSample
from workers.probes import Probe

log = logging.getLogger("clockq.telemetry")


@dataclass(frozen=True)
class SliceStats:
    samples: int
    mean_gpu_util: float | None  # None when no sample had a utilisation reading
    last: GpuSample  # the newest sample, for publishing


class _Accumulator:
    __slots__ = ("count", "last", "util_n", "util_sum")

    def __init__(self) -> None:
        self.count = self.util_n = 0
        self.util_sum = 0.0
        self.last: GpuSample | None = None

    def add(self, s: GpuSample) -> None:
        self.count += 1
        self.last = s
        if s.gpu_util is not None:
            self.util_n += 1
            self.util_sum += s.gpu_util

    def stats(self) -> SliceStats:
        assert self.last is not None
        return SliceStats(self.count, self.util_sum / self.util_n if self.util_n else None, self.last)


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
        self._kick = threading.Event()  # wakes the thread early when a new slice starts
        self._epoch = 0  # a sample taken in one slice never counts towards the next
        self._acc = _Accumulator()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
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
            acc.add(self.probe.sample(include_slow=False))
        return acc.stats()

    def _run(self) -> None:
        while True:
            self._armed.wait()
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
            self._kick.wait(self.interval_s)
