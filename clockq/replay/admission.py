"""Admission control, replayed with the live control loop's own rules.

Live, the "clockq: load sample" task records the load index (clockq/policy/load.py: busy GPUs
plus the GPUs queued jobs ask for, over the GPUs) every minute, and "clockq: forecast" turns the
forecast of it into decisions with `control.decide_admission` (close above 85 %, reopen below
75 %). While admission is closed, `control.admits` says which new jobs are held rather than
queued: by default only a job that would wait anyway (no GPU free, and queued work in a better
class than it asks for every GPU: `control.Room.full`). Each forecast asks the same of every
held job, most urgent tier first and then the oldest, and queues those it now admits; when
admission reopens it admits them all.

The replay has no trained model, so the forecast is persistence: the load index just sampled
stands for the one 15 minutes ahead. That is also what the live predictor serves until a model
beats persistence on held-out data. Live, admission waits out a warm-up before it acts on
persistence (CLOCKQ_ADMISSION_WARMUP_SAMPLES); a replay models a cluster in its steady state, so
its thresholds have none unless given one (`Thresholds.warmup_samples`), and its results are
those of the rule without a warm-up. Held jobs keep their submit time, so their held time counts
in their wait and their completion time, and a deadline that passes while a job is held ends it.
"""

from __future__ import annotations

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
    """The admission state of one replay and the jobs it holds, per tier rank in the order they
    arrived (which is their submit order)."""

    def __init__(self, thresholds: control.Thresholds, every_s: float = FORECAST_EVERY_S):
        self.thresholds = thresholds
        self.every_s = every_s
        self.open = True
        self.held: dict[int, list[J]] = {}
        self.stats = AdmissionStats()
        self.samples = 0  # load samples taken: persistence's warm-up counts them, as live
        self._closed_since: float | None = None

    def admits(self, tier_code: str, room: control.Room | None) -> bool:
        """Whether a new or held job of this tier is queued now (`control.admits`); `room`: what
        it would find, read only when `weighs_room` says the rule weighs it."""
        return control.admits(tier_code, self.open, hold=self.thresholds.hold, room=room)

    def weighs_room(self, tier_code: str) -> bool:
        return control.weighs_room(tier_code, self.open, hold=self.thresholds.hold)

    def hold(self, job: J, rank: int) -> None:
        """A new job held on arrival."""
        self.held.setdefault(rank, []).append(job)
        self.stats.held_jobs += 1

    def holds_any(self) -> bool:
        return any(self.held.values())

    def take_held(self, rank: int) -> list[J]:
        """The held jobs of one tier, oldest first, to be asked again; those not queued go back
        with `keep_holding`, in the same order."""
        return self.held.pop(rank, [])

    def keep_holding(self, job: J, rank: int) -> None:
        self.held.setdefault(rank, []).append(job)

    def decide(self, now: float, *, busy_gpus: int, waiting_gpus: int, gpus: int) -> None:
        """Sample the load index, judge it as the forecast, and open or close admission."""
        forecast = load.load_index(busy_gpus, waiting_gpus, gpus)
        assert forecast is not None  # a replay has GPUs
        self.samples += 1
        basis = control.Basis(control.PERSISTENCE, self.samples)  # the live rule's warm-up, if configured
        decision = control.decide_admission(forecast, self.open, self.thresholds, basis)
        if not decision.changed:
            return
        self.open = bool(decision.new)
        if not self.open:
            self.stats.closures += 1
            self._closed_since = now
        else:
            assert self._closed_since is not None
            self.stats.closed_s += now - self._closed_since
            self._closed_since = None
