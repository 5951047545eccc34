"""Delete the checkpoints of jobs that finished more than CLOCKQ_CHECKPOINT_RETENTION_S ago, so
finished work does not fill the disk, and, when CLOCKQ_RESULT_RETENTION_S is set, their results
after that long. A periodic task (beat) runs it on the control worker."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from clockq.jobs.checkpoints import CheckpointStore, StorageError
from clockq.jobs.models import Job, JobEvent
from clockq.jobs.results import ResultStorageError, ResultStore
from clockq.policy.states import TERMINAL_STATES

log = logging.getLogger("clockq.retention")


def delete_old_checkpoints(batch: int = 500) -> int:
    """One pass. Returns how many jobs' checkpoints were deleted."""
    cutoff = timezone.now() - timedelta(seconds=settings.CLOCKQ_CHECKPOINT_RETENTION_S)
    store = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR)
    due = Job.objects.filter(
        state__in=TERMINAL_STATES, finished_at__lt=cutoff, checkpoints_deleted_at__isnull=True
    ).values_list("id", "state", "result_bytes")[:batch]
    results = ResultStore(settings.CLOCKQ_CHECKPOINT_DIR)
    deleted = 0
    for job_id, state, result_bytes in due:
        # Mark first, only while the job is still finished: an operator who requeues it at the
        # same moment keeps its checkpoints; one who requeues it later starts it afresh.
        marked = Job.objects.filter(pk=job_id, state=state, checkpoints_deleted_at__isnull=True).update(
            checkpoints_deleted_at=timezone.now(), checkpoint_bytes=0, checkpoint_files=[], work_bytes=0, work_files=0
        )
        if marked != 1:
            continue
        try:
            if not result_bytes:
                # A result the job never got to record (it was cancelled as it finished): no one
                # can download it, so it goes with the checkpoints.
                results.delete(job_id)
            store.delete_job(job_id)
        except (StorageError, ResultStorageError) as exc:
            log.warning("%s; it stays on disk", exc)
        _note(job_id, state, f"checkpoints deleted {settings.CLOCKQ_CHECKPOINT_RETENTION_S} s after the job finished")
        deleted += 1
    if deleted:
        log.info("deleted the checkpoints of %s finished job(s)", deleted)
    return deleted


def delete_old_results(batch: int = 500) -> int:
    """One pass; nothing unless CLOCKQ_RESULT_RETENTION_S is set. Returns how many jobs' results
    were deleted."""
    keep_s = settings.CLOCKQ_RESULT_RETENTION_S
    if not keep_s:
        return 0
    cutoff = timezone.now() - timedelta(seconds=keep_s)
    store = ResultStore(settings.CLOCKQ_CHECKPOINT_DIR)
    due = Job.objects.filter(state__in=TERMINAL_STATES, finished_at__lt=cutoff, result_bytes__gt=0)
    deleted = 0
    for job_id, state in due.values_list("id", "state")[:batch]:
        try:
            store.delete(job_id)
        except ResultStorageError as exc:
            log.warning("%s; it stays on disk and on the job", exc)
            continue
        Job.objects.filter(pk=job_id).update(result_files=[], result_bytes=0)
        _note(job_id, state, f"result deleted {keep_s} s after the job finished")
        deleted += 1
    return deleted


def _note(job_id: int, state: str, reason: str) -> None:
    JobEvent.objects.create(job_id=job_id, from_state=state, to_state=state, reason=reason, actor="retention")
