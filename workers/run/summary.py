"""One INFO line per job when it ends on a worker: its slices, GPU time, preemptions, switches and
result. Each slice is logged at DEBUG only (Celery's per-task lines too: clockq/settings.py), so a
busy worker's log says what happened to jobs, not to every slice of them."""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.db.models import Count, Q

from clockq.jobs.models import Job
from clockq.policy.slicing import SliceOutcome
from clockq.policy.states import TERMINAL_STATES, JobState
from workers.run.outcome import RunOutcome

log = logging.getLogger("clockq.jobs.summary")

# The outcomes after which a job may have ended (a lost claim may be a cancel).
MAY_HAVE_ENDED = frozenset({RunOutcome.SUCCEEDED, RunOutcome.FAILED, RunOutcome.TIMED_OUT, RunOutcome.LOST_OWNERSHIP})


def job_summary(job_id: int) -> str | None:
    """The job's summary line, or None while it has not ended."""
    row = (
        Job.objects.filter(pk=job_id)
        .annotate(
            preemptions=Count("slices", filter=Q(slices__preempted=True)),
            switches=Count("slices", filter=Q(slices__outcome=SliceOutcome.YIELDED)),
        )
        .values("name", "state", "slice_count", "run_ms", "failures", "last_error", "preemptions", "switches")
        .first()
    )
    if row is None or row["state"] not in TERMINAL_STATES:
        return None
    result = row["state"]
    if row["state"] != JobState.SUCCEEDED and row["last_error"].strip():
        lines = row["last_error"].strip().splitlines()
        # A traceback's point is its last line; any other error's, its first.
        result += f": {(lines[-1] if lines[0].startswith('Traceback') else lines[0])[:200]}"
    return (
        f"job {job_id} ({row['name']}) ended {result}; {row['slice_count']} slice(s), "
        f"{row['run_ms'] / 1000:.1f} s of GPU time, {row['preemptions']} preemption(s), "
        f"{row['switches']} switch(es), {row['failures']} failure(s)"
    )


def log_run(job_id: int, outcome: RunOutcome) -> None:
    """The run at DEBUG, and the job's summary at INFO if the run ended it."""
    log.debug("job %s: %s", job_id, outcome)
    if outcome not in MAY_HAVE_ENDED:
        return
    try:
        line = job_summary(job_id)
    except DatabaseError as exc:  # a log line never fails the run
        log.warning("job %s: no summary, the database failed: %s", job_id, exc)
        return
    if line is not None:
        log.info("%s", line)
