"""Sampling a GPU while a slice runs: one long-lived thread, armed and disarmed per slice."""

from __future__ import annotations

import statistics
import threading
import time

import pytest

from workers.probes import NvmlProbe, SimulatedProbe
from workers.sampler import SliceSampler


class CountingProbe:
    """A simulated GPU that lets a test wait until it has been sampled n times."""

    def __init__(self, util: float = 0.9):
        self.inner = SimulatedProbe(0)
        self.inner.set_load(util)
        self.gpu_index = 0
        self.simulated = True
        self.count = 0
        self._changed = threading.Condition()

    def set_load(self, util: float) -> None:
        self.inner.set_load(util)

    def sample(self, include_slow: bool = True):
        s = self.inner.sample(include_slow)
        with self._changed:
            self.count += 1
            self._changed.notify_all()
        return s

    def free_memory_mib(self):
        return self.inner.free_memory_mib()

    def wait_for_samples(self, n: int, timeout: float = 5.0) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self.count >= n, timeout), f"only {self.count} of {n} samples"


def test_slice_sampler_averages_over_a_slice_whose_load_changes():
    probe = CountingProbe(0.9)
    sampler = SliceSampler(probe, interval_s=0.002)
    sampler.start()
    probe.wait_for_samples(5)
    probe.set_load(0.1)
    probe.wait_for_samples(probe.count + 6)
    stats = sampler.stop()
    assert stats.samples >= 11
    assert 0.1 < stats.mean_gpu_util < 0.9
    assert stats.last.gpu_util == 0.1


def test_a_sample_from_one_slice_never_counts_towards_the_next():
    probe = CountingProbe(0.9)
    sampler = SliceSampler(probe, interval_s=0.002)
    sampler.start()
    probe.wait_for_samples(3)
    sampler.stop()
    probe.set_load(0.2)
    sampler.start()
    probe.wait_for_samples(probe.count + 3)
    assert sampler.stop().mean_gpu_util == pytest.approx(0.2)


def test_slice_sampler_takes_a_sample_even_for_a_very_short_slice_and_reuses_one_thread():
    probe = CountingProbe(0.4)
    sampler = SliceSampler(probe, interval_s=10.0)
    threads = set()
    for _ in range(5):
        sampler.start()
        stats = sampler.stop()
        assert stats.samples >= 1 and stats.mean_gpu_util == 0.4
        threads.add(sampler._thread.ident)
    assert len(threads) == 1
    with pytest.raises(RuntimeError):
        sampler.stop()
    sampler.start()
    with pytest.raises(RuntimeError):
        sampler.start()
    sampler.stop()


def test_slice_sampler_without_nvml_reports_errors_not_utilisation(no_nvml):
    sampler = SliceSampler(NvmlProbe(0), interval_s=0.002)
    sampler.start()
    stats = sampler.stop()
    assert stats.samples >= 1 and stats.mean_gpu_util is None
    assert stats.last.error and "NVML unavailable" in stats.last.error


@pytest.mark.slow
def test_slice_sampler_start_and_stop_cost_the_caller_little():
    """Arming and disarming per 20-50 ms slice must stay far below the slice itself. A time
    budget, so it runs with -m slow, not in the default suite."""
    probe = CountingProbe(0.9)
    sampler = SliceSampler(probe)
    sampler.start()
    sampler.stop()  # the one-time thread start is not part of the per-slice cost
    costs = []
    for _ in range(60):
        t0 = time.perf_counter()
        sampler.start()
        t1 = time.perf_counter()
        probe.wait_for_samples(probe.count + 1)  # the slice runs; the thread samples
        t2 = time.perf_counter()
        sampler.stop()
        t3 = time.perf_counter()
        costs.append((t1 - t0) + (t3 - t2))
    # Worst case: a slice so short the thread took no sample, so stop() samples itself.
    short = []
    for _ in range(60):
        t0 = time.perf_counter()
        sampler.start()
        sampler.stop()
        short.append(time.perf_counter() - t0)
    assert statistics.median(costs) < 0.001, costs
    assert statistics.median(short) < 0.002, short
