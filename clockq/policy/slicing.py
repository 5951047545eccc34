"""How long a slice runs, and what happens when it ends."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class MadeWayFor(Protocol):
    """What a job leaves its GPU to at a boundary, as a structured decision: the order's
    (`making_way.MakeWay`), or an RT lane's that needs the room. Words only for people."""

    def describe(self) -> str: ...


class SliceOutcome(StrEnum):
    COMPLETED = "completed"  # the job finished in this slice
    YIELDED = "yielded"  # checkpointed and requeued so another job can run
    CONTINUED = "continued"  # nothing to make way for: the next slice follows at once
    FAILED = "failed"  # the workload raised; the job rolls back to its last checkpoint
    LOST = "lost"  # the worker vanished mid-slice
    FAULT = "fault"  # the infrastructure failed under it (checkpoint storage); not the job's fault


class BoundaryAction(StrEnum):
    FINISH = "finish"
    CONTINUE = "continue"
    YIELD = "yield"
    HOLD = "hold"
    TIME_OUT = "time_out"


class PendingAction(StrEnum):
    """What an operator asked of a running job; the worker honours it at the next boundary."""

    NONE = ""
    HOLD = "hold"
    REQUEUE = "requeue"


@dataclass(frozen=True)
class Boundary:
    """What a worker knows at the end of a slice."""

    done: bool
    # What this job leaves its GPU to now, as the order decides (clockq/policy/making_way.py:
    # `make_way`'s `MakeWay`, which has `leaves_at`), or an RT lane that needs the room; None if
    # nothing comes first. The decision whole: its words are made only for the reason.
    making_way: MadeWayFor | None = None
    pending_action: PendingAction = PendingAction.NONE
    past_deadline: bool = False
    shutting_down: bool = False
    # The slice ended at a step, before its time was up: an urgent job was announced (or an
    # operator changed the job). It changes what the decision is called, not what it is.
    cut_short: bool = False
    # This worker's checkpoint storage fails (a full disk): making way would lose the work done
    # since the job's last checkpoint.
    checkpoints_failing: bool = False


@dataclass(frozen=True)
class Decision:
    action: BoundaryAction
    reason: str


class PlanReason(StrEnum):
    FORMULA = "formula"  # the specification's utilisation rule (or the base, with no history)
    FLOOR = "floor"  # raised to the tier's minimum slice
    OVERHEAD = "overhead"  # stretched so switching stays within the overhead budget


@dataclass(frozen=True)
class SlicePlan:
    ms: int
    reason: PlanReason


def plan_slice(
    *,
    base_ms: int,
    min_ms: int,
    avg_util: float | None = None,
    switch_cost_ms: float | None = None,
    overhead_budget: float = 0.05,
    max_ms: int = 5_000,
) -> SlicePlan:
    """How long the next slice may run.

    The specification's rule: efficiency = 0.8 + 0.4 * min(avg_util / 0.9, 1.0), and
    slice = max(base * efficiency, min_ms); a job with no history gets `base_ms`. Then, so that
    switching never eats more than `overhead_budget` of the GPU, a slice is never shorter than
    switch_cost / overhead_budget (a job with a heavy checkpoint gets longer slices), up to
    `max_ms`. That keeps a switch within the budget of the slice's useful time, a little inside
    it as a share of all GPU time (4.8 % for 5 %): a margin for a switch cost that is an estimate.
    """
    if avg_util is None:
        ms, reason = base_ms, PlanReason.FORMULA
    else:
        util = min(max(avg_util, 0.0), 1.0)
        ms, reason = round(base_ms * (0.8 + 0.4 * min(util / 0.9, 1.0))), PlanReason.FORMULA
    if ms < min_ms:
        ms, reason = min_ms, PlanReason.FLOOR
    if switch_cost_ms and overhead_budget > 0:
        needed = min(math.ceil(switch_cost_ms / overhead_budget), max_ms)
        if needed > ms:
            ms, reason = needed, PlanReason.OVERHEAD
    return SlicePlan(ms, reason)


def ewma(previous: float | None, sample: float, alpha: float = 0.3) -> float:
    """Exponentially weighted moving average; the first sample starts it."""
    return sample if previous is None else (1 - alpha) * previous + alpha * sample


# A switch whose hop stalled (a disk flush, a loaded host) says little about the next ones: a
# sample counts for at most this many times the estimate. One 200 ms stall among 10 ms switches then
# lifts the estimate to 16 ms, not 67 ms (and the planned slice to 320 ms, not 1.3 s), while a
# lasting rise still lifts it by 60 % a switch.
SWITCH_SAMPLE_CAP = 3.0


def switch_cost_ewma(previous: float | None, sample: float) -> float:
    """The running estimate of a worker's switch overhead (ms: requeue, hop, claim), robust to a
    single stall. A job's own checkpoint and restore are added to it as measured."""
    if previous:
        sample = min(sample, SWITCH_SAMPLE_CAP * previous)
    return ewma(previous, sample)


# How the history names a yield before the slice's planned end (an urgent job interrupted it).
PREEMPTED = "preempted"
KEEPS_GPU_WHILE_STORAGE_FAILS = (
    "kept the GPU: checkpoint storage is failing, and making way would lose its work since its last checkpoint"
)


def decide_at_boundary(b: Boundary) -> Decision:
    """Finish, continue or switch. Switch only when it pays: a job that comes first in the
    order must be waiting, and the job's state must be able to leave the GPU. While checkpoints
    cannot be written, a job makes way for no one (an RT job included, which waits for another
    GPU or for the storage); what an operator or a deadline asks for still happens."""
    decision = _decide(b)
    asked = b.shutting_down or b.pending_action == PendingAction.REQUEUE
    if decision.action == BoundaryAction.YIELD and b.checkpoints_failing and not asked:
        return Decision(BoundaryAction.CONTINUE, KEEPS_GPU_WHILE_STORAGE_FAILS)
    return decision


def _decide(b: Boundary) -> Decision:
    if b.done:
        return Decision(BoundaryAction.FINISH, "workload reported completion")
    if b.past_deadline:
        return Decision(BoundaryAction.TIME_OUT, "deadline passed while running")
    if b.pending_action == PendingAction.HOLD:
        return Decision(BoundaryAction.HOLD, "held by an operator")
    if b.pending_action == PendingAction.REQUEUE:
        return Decision(BoundaryAction.YIELD, "requeued by an operator")
    if b.shutting_down:
        return Decision(BoundaryAction.YIELD, "worker shutting down")
    if b.making_way is not None:
        made_way = f"made way for {b.making_way.describe()}, which comes first in the order"
        return Decision(BoundaryAction.YIELD, f"{PREEMPTED}: {made_way}" if b.cut_short else made_way)
    return Decision(BoundaryAction.CONTINUE, "nothing waiting that comes first in the order")
