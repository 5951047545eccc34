"""Service levels: what a wait or a finish means against a tier's targets. Pure rules; the SLO
check, the workers' claim and the KPI rollup all judge jobs with them."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import TypeVar

# The clock is injected: the live KPI rollup passes datetimes, the trace simulator seconds.
Instant = TypeVar("Instant", datetime, float)


class WaitVerdict(StrEnum):
    WITHIN = "within"  # still within its tier's wait target
    LATE = "late"  # past the target: marked late, keeps its place
    TIMED_OUT = "timed_out"  # past the tier's start timeout: worthless now, ends timed_out


def judge_wait(waited_ms: float, *, target_ms: int | None, start_timeout_ms: int | None) -> WaitVerdict:
    """A job that has not started yet, `waited_ms` after its submission."""
    if start_timeout_ms is not None and waited_ms > start_timeout_ms:
        return WaitVerdict.TIMED_OUT
    if target_ms is not None and waited_ms > target_ms:
        return WaitVerdict.LATE
    return WaitVerdict.WITHIN


def finished_on_time(
    *,
    succeeded: bool,
    finished_at: Instant | None,
    deadline: Instant | None,
    first_wait_ms: int | None,
    target_ms: int | None,
) -> bool:
    """On time means finished by the deadline; a job without one is on time when its wait for
    the first start stayed within its tier's target (a tier without a target: always)."""
    if not succeeded or finished_at is None:
        return False
    if deadline is not None:
        return finished_at <= deadline
    return target_ms is None or (first_wait_ms is not None and first_wait_ms <= target_ms)
