"""Admission control, replayed with the live control loop's own rules.

Live, the "clockq: load sample" task records the load index (clockq/policy/load.py: busy GPUs
plus the GPUs queued jobs ask for, over the GPUs) every minute, and "clockq: forecast" turns the
forecast of it into decisions with `control.decide_admission` (close above 85 %, reopen below
75 %). While admission is closed a new job of a tier that `control.admits` does not let in is
held, not queued; it is queued when admission reopens, by tier and then by age.

The replay has no trained model, so the forecast is persistence: the load index just sampled
stands for the one 15 minutes ahead. That is also what the live predictor serves until a model
beats persistence on held-out data. Held jobs keep their submit time, so their held time counts
in their wait and their completion time, and a deadline that passes while a job is held ends it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

from clockq.policy import control, load

J = TypeVar("J")

FORECAST_EVERY_S = 60.0  # CLOCKQ_FORECAST_EVERY_S and CLOCKQ_LOAD_SAMPLE_EVERY_S


@dataclass
class AdmissionStats:
    closures: int = 0  # times admission closed
    held_jobs: int = 0  # jobs held on arrival
    closed_s: float = 0.0  # simulated time admission was closed


class Admission(Generic[J]):
    """The admission state of one replay and the jobs it holds."""

    def __init__(self, thresholds: control.Thresholds, every_s: float = FORECAST_EVERY_S):
        self.thresholds = thresholds
        self.every_s = every_s
        self.open = True
        self.held: deque[J] = deque()
        self.stats = AdmissionStats()
        self._closed_since: float | None = None

    def admits(self, tier_code: str) -> bool:
        return control.admits(tier_code, self.open)

    def hold(self, job: J) -> None:
        self.held.append(job)
        self.stats.held_jobs += 1

    def decide(self, now: float, *, busy_gpus: int, waiting_gpus: int, gpus: int) -> list[J]:
        """Sample the load index, judge it as the forecast, and return the held jobs to queue
        now (all of them, oldest first, when admission is open)."""
        forecast = load.load_index(busy_gpus, waiting_gpus, gpus)
        assert forecast is not None  # a replay has GPUs
        decision = control.decide_admission(forecast, self.open, self.thresholds)
        if decision.changed:
            self.open = bool(decision.new)
            if not self.open:
                self.stats.closures += 1
                self._closed_since = now
            else:
                assert self._closed_since is not None
                self.stats.closed_s += now - self._closed_since
                self._closed_since = None
        if not self.open:
            return []
        released = list(self.held)
        self.held.clear()
        return released
