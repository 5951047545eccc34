"""What one claim of one job knows as it runs, from its claim to its end: its run state.

`JobRun` (workers/slice_runner.py) owns it and alone writes it. A part is given what it reads
of it and returns what changed (the slice's record from the step loop, `Decided` from the
boundary); JobRun then writes that here. So the state of a slice at any line is in one place.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from clockq.jobs import order
from clockq.policy.slicing import Decision
from workers.run.claim import ClaimedJob


@dataclass
class RunState:
    claimed_at: float  # (monotonic) when the job got this GPU
    progress: float  # in [0, 1], as the workload last reported it
    util_ewma: float | None  # its GPU use, smoothed over its slices (what the next plan reads)
    run_ms: float  # its service, this claim's slices included
    # What this claim's restore adds to the job's switch cost: the restore of a checkpoint, not a
    # first start's setup (framework import, model build), which no switch repeats.
    restore_ms: float = 0.0
    finish_pending: bool = False  # done, but its result waits for room on the storage
    # It left (or leaves at this boundary) to give an RT job in its GPU's lane its memory
    # (workers/run/pause.py): not kept warm, and its worker waits while the lane has the GPU.
    left_for_lane: bool = False
    # The waiting job its last decision left the GPU to, for the order: what a hand-over takes.
    made_way_to: order.Waiting | None = None

    @classmethod
    def of(cls, job: ClaimedJob) -> RunState:
        return cls(
            claimed_at=time.monotonic(), progress=job.progress, util_ewma=job.util_ewma, run_ms=float(job.run_ms)
        )

    def held_s(self) -> float:
        """How long the job has held its GPU since its claim."""
        return time.monotonic() - self.claimed_at


@dataclass(frozen=True)
class Decided:
    """The boundary's decision and what it changed (`SliceBoundary.decide`)."""

    decision: Decision
    made_way_to: order.Waiting | None = None  # see RunState.made_way_to
    # The next checkpoint's persist mark, set ahead by the read the decision came from (name,
    # when), for the checkpoint this boundary takes (`Checkpointer.take`).
    marked: tuple[str, float] | None = None
