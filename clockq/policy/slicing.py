"""How long a slice runs, and what happens when it ends."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class SliceOutcome(StrEnum):
    COMPLETED = "completed"  # the job finished in this slice
    YIELDED = "yielded"  # checkpointed and requeued so another job can run
    CONTINUED = "continued"  # nothing to make way for: the next slice follows at once
    FAILED = "failed"  # the workload raised; the job rolls back to its last checkpoint
    LOST = "lost"  # the worker vanished mid-slice


class BoundaryAction(StrEnum):
    FINISH = "finish"
    CONTINUE = "continue"
    YIELD = "yield"
    HOLD = "hold"
    TIME_OUT = "time_out"


# What an operator asked of a running job; the worker honours it at the next boundary.
PENDING_NONE = ""
PENDING_HOLD = "hold"
PENDING_REQUEUE = "requeue"


@dataclass(frozen=True)
class Boundary:
    """What a worker knows at the end of a slice."""

    done: bool
    job_rank: int
    waiting_by_rank: Sequence[int]  # messages waiting per tier rank, most urgent first
    pending_action: str = PENDING_NONE
    past_deadline: bool = False
    shutting_down: bool = False


@dataclass(frozen=True)
class Decision:
    action: BoundaryAction
    reason: str


def plan_slice_ms(base_ms: int, min_ms: int, avg_util: float | None = None) -> int:
    """The specification's rule: efficient jobs get longer slices, never below `min_ms`.

    efficiency = 0.8 + 0.4 * min(avg_util / 0.9, 1.0); a job with no history gets `base_ms`.
    """
    if avg_util is None:
        return max(base_ms, min_ms)
    util = min(max(avg_util, 0.0), 1.0)
    efficiency = 0.8 + 0.4 * min(util / 0.9, 1.0)
    return max(round(base_ms * efficiency), min_ms)


def waiting_ahead(job_rank: int, waiting_by_rank: Sequence[int]) -> int:
    """Jobs this one should make way for: those of the same tier or a more urgent one."""
    return sum(waiting_by_rank[: job_rank + 1])


def decide_at_boundary(b: Boundary) -> Decision:
    """Finish, continue or switch. Switch only when it pays: someone must be waiting."""
    if b.done:
        return Decision(BoundaryAction.FINISH, "workload reported completion")
    if b.past_deadline:
        return Decision(BoundaryAction.TIME_OUT, "deadline passed while running")
    if b.pending_action == PENDING_HOLD:
        return Decision(BoundaryAction.HOLD, "held by an operator")
    if b.pending_action == PENDING_REQUEUE:
        return Decision(BoundaryAction.YIELD, "requeued by an operator")
    if b.shutting_down:
        return Decision(BoundaryAction.YIELD, "worker shutting down")
    ahead = waiting_ahead(b.job_rank, b.waiting_by_rank)
    if ahead:
        return Decision(BoundaryAction.YIELD, f"{ahead} job(s) waiting at the same or a higher tier")
    return Decision(BoundaryAction.CONTINUE, "nothing waiting to make way for")
