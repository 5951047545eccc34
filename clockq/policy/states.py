"""Job states and the transitions allowed between them."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    HELD = "held"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


S = JobState

ALLOWED_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    S.HELD: frozenset({S.QUEUED, S.CANCELLED, S.TIMED_OUT}),
    # queued -> queued is a re-dispatch: same state, new dispatch token.
    S.QUEUED: frozenset({S.QUEUED, S.RUNNING, S.HELD, S.CANCELLED, S.TIMED_OUT}),
    S.RUNNING: frozenset({S.QUEUED, S.HELD, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT}),
    S.SUCCEEDED: frozenset(),
    # An operator may requeue a job that ended badly; it resumes from its last checkpoint.
    S.FAILED: frozenset({S.QUEUED}),
    S.CANCELLED: frozenset({S.QUEUED}),
    S.TIMED_OUT: frozenset({S.QUEUED}),
}

TERMINAL_STATES = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT})
ACTIVE_STATES = frozenset({S.QUEUED, S.RUNNING})


def can_transition(src: JobState, dst: JobState) -> bool:
    return dst in ALLOWED_TRANSITIONS[src]


def sources_for(dst: JobState) -> frozenset[JobState]:
    """Every state from which `dst` may be entered."""
    return frozenset(src for src, dsts in ALLOWED_TRANSITIONS.items() if dst in dsts)
