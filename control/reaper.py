"""Take back running jobs whose worker stopped renewing its lease, and run them again from
their last good checkpoint (the rule is `clockq.jobs.take_back`, shared with a GPU's main worker,
which takes back its dead RT lane's jobs at once: workers/lane_life.py)."""

from __future__ import annotations

import logging

from django.utils import timezone

from clockq.jobs.models import Job
from clockq.jobs.take_back import LostRun, take_back

log = logging.getLogger("clockq.reaper")


def reap_expired_leases() -> int:
    """One pass. Returns how many jobs were taken back."""
    reaped = 0
    for run in LostRun.of(Job.objects.filter(lease_expires_at__lt=timezone.now())):
        expired = run.lease_expires_at
        assert expired is not None  # the filter read only jobs whose lease expired
        # The new token makes anything the lost worker still sends stale: a late slice end, a
        # late completion or its re-delivered message all fail their compare-and-set.
        why = f"lease of {run.worker or 'its worker'} expired at {expired:%H:%M:%S}"
        if take_back(run, lost_at=expired, why=why, actor="reaper"):
            reaped += 1
        # else: the worker renewed or finished in the meantime
    if reaped:
        log.warning("took back %s job(s) whose worker lease expired", reaped)
    return reaped
