"""The step loop: plan a slice, then step the workload until the slice is used up.

A slice also ends early when the job is done, or at a step when an urgent job takes the GPU
(the order names this job to make way for it: workers/run/boundary.py) or an operator changed
something (an interrupt). Near its planned end the loop starts the boundary's read, so
the GPU does not wait for it after the last step.

The loop writes what the slice did in its `SliceRecord` (its steps, its service, its progress,
its pause, why it left), and nothing else: JobRun folds the record into the claim's run state
(workers/run/state.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from clockq.policy.lanes import service_ms
from clockq.policy.slicing import SlicePlan, plan_slice
from workers import shutdown
from workers.run.boundary import SliceBoundary, prefetch_lead_s
from workers.run.claim import ClaimedJob
from workers.run.errors import workload_errors
from workers.run.metrics_recorder import MetricsRecorder
from workers.run.pause import LaneNeedsRoom, PauseWatch
from workers.run.tiers import RunTiers
from workers.runtime import WorkerThreads
from workers.workloads.base import Workload


@dataclass
class SliceRecord:
    started_at: datetime
    plan: SlicePlan
    used_ms: float = 0.0
    steps: int = 0
    restore_ms: float = 0.0
    checkpoint_bytes: int = 0
    checkpoint_ms: float = 0.0
    checkpoint_generation: int | None = None  # the one its end took, if it took one
    gpu_util: float | None = None
    cut_short: bool = False  # ended at a step by an interrupt, before its time was up
    preempted: bool = False  # and made way for an urgent job
    compute_end: float = 0.0  # perf_counter when its last step ended
    paused_ms: float = 0.0  # paused in place for an RT job in its GPU's lane (workers/run/pause.py)
    progress: float | None = None  # in [0, 1], as its last step reported it (None: no step ended)
    # It ended at a step to make way for an RT job in its GPU's lane through the checkpoint path
    # (workers/run/pause.py), and why.
    lane_leave: LaneNeedsRoom | None = None


class StepLoop:
    """A claim's slices as its workload steps them: each slice's plan, and its steps."""

    def __init__(
        self,
        job: ClaimedJob,
        threads: WorkerThreads,
        *,
        tiers: RunTiers,
        boundary: SliceBoundary,
        metrics: MetricsRecorder,
        pauses: PauseWatch,
    ):
        self.job = job
        self.job_id = job.id
        self.threads = threads
        self.tiers = tiers
        self.boundary = boundary
        self.metrics = metrics
        self.pauses = pauses

    def plan(self, util_ewma: float | None) -> SliceRecord:
        """The next slice, as long as the policy plans it for this job's tier and its GPU use
        so far (`util_ewma`)."""
        plan = plan_slice(
            base_ms=self.tiers.current.base_slice_ms,
            min_ms=self.tiers.current.min_slice_ms,
            avg_util=util_ewma,
            switch_cost_ms=self.job.switch_cost_ms,
            overhead_budget=settings.CLOCKQ_OVERHEAD_BUDGET,
            max_ms=settings.CLOCKQ_MAX_SLICE_MS,
        )
        return SliceRecord(timezone.now(), plan)

    def run_slice(self, workload: Workload, record: SliceRecord) -> bool:
        """Step until the slice is used up or cut short, writing what it did in `record`;
        whether the job is done."""
        interrupts, boundary = self.threads.interrupts, self.boundary
        began = start = last = time.perf_counter()  # `start` moves on by each pause: a pause is not service
        budget_s = record.plan.ms / 1000.0
        step_s = 0.0  # the last step's length: the next one is likely as long
        done = False
        self.boundary.new_slice(record.plan.ms)
        self.threads.sampler.start()
        try:
            with workload_errors():
                while True:
                    # Likely the slice's last step, or one of the last few short ones: read what
                    # the boundary decides from while they run, so the GPU does not wait for that
                    # read after them.
                    lead_s = prefetch_lead_s(step_s, self.threads.boundary_read_s, budget_s)
                    if last + lead_s - start >= budget_s:
                        self.boundary.read_ahead()
                    progress = float(workload.step())
                    step_s, last = time.perf_counter() - last, time.perf_counter()
                    if not math.isfinite(progress):
                        raise ValueError(f"step() returned {progress}, not a progress in [0, 1]")
                    if records := workload.metrics():
                        self.metrics.record(records)
                    record.steps += 1
                    record.progress = min(max(progress, 0.0), 1.0)
                    if record.progress >= 1.0:
                        done = True
                        break
                    if time.perf_counter() - start >= budget_s:
                        break
                    # An operator's change, an urgent job that takes this GPU, or this worker's
                    # stop (a slice may be minutes long, longer than the stop's grace) ends the
                    # slice here.
                    if (
                        interrupts.poked(self.job_id)
                        or shutdown.requested.is_set()
                        or boundary.interrupted((last - start) * 1000)
                    ):
                        record.cut_short = True
                        break
                    # The GPU's RT lane takes an RT job: pause here, the state where it is.
                    if (asked := self.pauses.asked()) is not None:
                        held = self.pauses.hold(asked)
                        start, last = start + held.paused_s, last + held.paused_s
                        record.paused_ms += held.paused_s * 1000
                        if held.leave is not None:  # no room beside it, or paused too long
                            record.cut_short = True
                            record.lane_leave = held.leave
                            break
        finally:
            record.compute_end = time.perf_counter()
            record.used_ms = service_ms((record.compute_end - began) * 1000, record.paused_ms)
            stats = self.threads.sampler.stop()
            record.gpu_util = stats.mean_gpu_util
            self.threads.publisher.maybe_publish(stats.last)
        return done
