"""Take back running jobs whose worker stopped renewing its lease, and run them again from
their last good checkpoint. The lost slice is recorded as `lost`, and the slices recorded after
that checkpoint was taken (without one of their own) as rolled back: the job runs their steps
again."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from clockq.bus import counters
from clockq.jobs.checkpoints import generation_label
from clockq.jobs.models import Job, Slice
from clockq.jobs.transitions import transition
from clockq.policy.slicing import SliceOutcome
from clockq.policy.states import JobState

log = logging.getLogger("clockq.reaper")


def reap_expired_leases() -> int:
    """One pass. Returns how many jobs were taken back."""
    now = timezone.now()
    expired = Job.objects.filter(state=JobState.RUNNING, lease_expires_at__lt=now).values_list(
        "id",
        "dispatch_token",
        "worker",
        "slice_started_at",
        "checkpoint_files",
        "lease_expires_at",
        "original_tier__code",
    )
    reaped = 0
    for job_id, token, worker, slice_started_at, files, lease_expired_at, tier in expired:
        # What the job resumes from, as its history says: the generation the database names.
        generation = generation_label(files[0]) if files else 0
        with transaction.atomic():
            # The new token makes anything the lost worker still sends stale: a late slice end,
            # a late completion or its re-delivered message all fail their compare-and-set.
            changed = transition(
                job_id,
                to=JobState.QUEUED,
                expect={JobState.RUNNING},
                token=token,
                rotate_token=True,
                reason=f"lease of {worker or 'its worker'} expired at {lease_expired_at:%H:%M:%S}; "
                f"running again from checkpoint generation {generation}",
                actor="reaper",
            )
            if changed is None:
                continue  # the worker renewed or finished in the meantime
            started = slice_started_at or lease_expired_at
            Slice.objects.create(
                job_id=job_id,
                worker=worker or "unknown",
                gpu_index=_gpu_of(worker),
                started_at=started,
                ended_at=lease_expired_at,
                planned_ms=0,
                used_ms=0,
                outcome=SliceOutcome.LOST,
            )
            if isinstance(generation, int):
                Slice.objects.roll_back_to(job_id, generation)
            counters.count_slice(tier=tier, outcome=SliceOutcome.LOST, used_ms=0)
        reaped += 1
    if reaped:
        log.warning("took back %s job(s) whose worker lease expired", reaped)
    return reaped


def _gpu_of(worker: str) -> int:
    """gpu<N>@host -> N, or -1 when the name says nothing."""
    name = worker.split("@", 1)[0]
    return int(name[3:]) if name.startswith("gpu") and name[3:].isdigit() else -1
