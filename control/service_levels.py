"""The SLO check: enforce the tiers' service levels on jobs that are still waiting.

- A job not started within its tier's start timeout (RT: 1 s) ends `timed_out`: a late
  inference is worthless.
- A job not started within its tier's wait target is marked late; it keeps its place.
- A job still waiting (queued or held) when its deadline passes ends `timed_out`, keeping its
  checkpoints. A running one times out at its next slice boundary (workers/slice_runner.py).

Workers apply the same rules when they claim a job (clockq/policy/service_levels.py), so a job
is judged at the moment it starts too, not only at the next tick. The sweep itself is the control
role's: beat sends "clockq: SLO check" every 10 s to the control worker (control/tasks.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from clockq.jobs.models import Job, JobEvent, QueueTier
from clockq.jobs.transitions import transition
from clockq.policy.states import JobState

log = logging.getLogger("clockq.slo")

WAITING = (JobState.QUEUED, JobState.HELD)


@dataclass(frozen=True)
class SloReport:
    start_timeouts: int
    late: int
    deadline_timeouts: int


def check_service_levels(now: datetime | None = None) -> SloReport:
    now = now or timezone.now()
    report = SloReport(_start_timeouts(now), _mark_late(now), time_out_overdue_jobs(now))
    if report.start_timeouts or report.deadline_timeouts:
        log.warning("SLO check: %s", report)
    return report


def _start_timeouts(now: datetime) -> int:
    done = 0
    for tier in QueueTier.objects.filter(start_timeout_ms__isnull=False):
        cutoff = now - timedelta(milliseconds=tier.start_timeout_ms)
        never_started = Job.objects.filter(
            state__in=WAITING, original_tier=tier, first_started_at__isnull=True, submitted_at__lt=cutoff
        )
        reason = f"not started within {tier.code}'s start timeout of {tier.start_timeout_ms} ms"
        done += _time_out(never_started, reason, now)
    return done


def _mark_late(now: datetime) -> int:
    marked = 0
    for tier in QueueTier.objects.filter(wait_target_ms__isnull=False):
        cutoff = now - timedelta(milliseconds=tier.wait_target_ms)
        late = Job.objects.filter(
            state__in=WAITING,
            original_tier=tier,
            first_started_at__isnull=True,
            late_at__isnull=True,
            submitted_at__lt=cutoff,
        )
        with transaction.atomic():
            rows = list(late.select_for_update().values_list("id", "state")[:5000])
            if not rows:
                continue
            Job.objects.filter(pk__in=[pk for pk, _ in rows], late_at__isnull=True).update(late_at=now)
            target = _duration(tier.wait_target_ms)
            reason = f"late: not started within {tier.code}'s wait target of {target}; keeps its place"
            JobEvent.objects.bulk_create(
                JobEvent(job_id=pk, from_state=state, to_state=state, reason=reason, actor="SLO check")
                for pk, state in rows
            )
        marked += len(rows)
    return marked


def time_out_overdue_jobs(now: datetime | None = None) -> int:
    """Jobs still waiting (queued or held) when their deadline passes end `timed_out`, instead of
    waiting on for a start that no longer helps anyone. Their checkpoints are kept."""
    now = now or timezone.now()
    overdue = Job.objects.filter(state__in=WAITING, deadline__lt=now)
    return _time_out(overdue, "deadline passed while {state}", now)


def _time_out(jobs, reason: str, now: datetime) -> int:
    """Each of `jobs` still in the state read ends `timed_out`, with `reason` ({state}: the state
    it was in). One that moved meanwhile (a worker claimed it) is left alone by the
    compare-and-set."""
    timed_out = 0
    for job_id, state in jobs.values_list("id", "state"):
        changed = transition(
            job_id,
            to=JobState.TIMED_OUT,
            expect={JobState(state)},
            rotate_token=True,
            reason=reason.format(state=state),
            actor="SLO check",
            updates={"finished_at": now},
        )
        timed_out += changed is not None
    return timed_out


def _duration(ms: int) -> str:
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:g} s"
    if ms < 3_600_000:
        return f"{ms / 60_000:g} min"
    return f"{ms / 3_600_000:g} h"
