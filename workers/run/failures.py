"""A slice that failed: the job goes back to its last good checkpoint, and the slice ends.

How it ends depends on whose fault it was. The workload raised: the job is retried from that
checkpoint, up to CLOCKQ_MAX_RETRIES, then fails. The checkpoint storage failed: the job goes
back to its queue uncharged, and this worker backs off, unless the fault has followed the job
(CLOCKQ_JOB_STORAGE_FAULTS claims in a row): then it is the job's, and the job fails. The job
cannot run as things are (over its owner's quota, or refused here): it fails at once.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.utils import timezone

from clockq.jobs.checkpoints import StorageError
from clockq.jobs.models import Job
from clockq.policy.slicing import SliceOutcome
from clockq.policy.states import JobState
from workers.run.checkpointer import Checkpointer
from workers.run.errors import LostOwnership
from workers.run.outcome import RunOutcome
from workers.run.slice_writes import SliceWrites
from workers.run.steps import SliceRecord
from workers.runtime import WorkerStores

log = logging.getLogger("clockq.slices")


class StorageFollowsJob(Exception):
    """The store failed this job's writes CLOCKQ_JOB_STORAGE_FAULTS times while it took others."""

    def __init__(self, faults: int):
        super().__init__(
            f"the checkpoint storage failed under this job {faults} times while it took other writes "
            f"(CLOCKQ_JOB_STORAGE_FAULTS={settings.CLOCKQ_JOB_STORAGE_FAULTS}): the fault follows the job, "
            "so it is the job's; its last good checkpoint is kept"
        )


class SliceFailures:
    """The endings of one claim's failed slices; `roll_back` forgets the slice's own work."""

    def __init__(
        self,
        job_id: int,
        stores: WorkerStores,
        *,
        checkpoints: Checkpointer,
        writes: SliceWrites,
        roll_back: Callable[[], None],
    ):
        self.job_id = job_id
        self.stores = stores
        self.checkpoints = checkpoints
        self.writes = writes
        self.roll_back = roll_back

    def after_failure(self, exc: BaseException, record: SliceRecord) -> RunOutcome:
        """The workload (or its checkpoint) raised."""
        error = "".join(traceback.format_exception(exc, limit=8))[-4000:]
        log.warning("job %s: workload raised %r", self.job_id, exc)
        failures = (Job.objects.filter(pk=self.job_id).values_list("failures", flat=True).first() or 0) + 1
        limit = settings.CLOCKQ_MAX_RETRIES
        give_up = failures > limit
        to = JobState.FAILED if give_up else JobState.QUEUED
        reason = (
            f"failed {failures} time(s), over the retry limit of {limit}: {exc!r}"
            if give_up
            else f"rolled back to checkpoint generation {self.checkpoints.saved_generation()} after {exc!r}; "
            f"retry {failures} of {limit}"
        )
        self.roll_back()
        extra: dict[str, Any] = {"failures": failures, "last_error": error}
        if give_up:
            extra["finished_at"] = timezone.now()
        try:
            self.writes.end(
                record,
                SliceOutcome.FAILED,
                to,
                reason[:1000],
                extra,
                rolled_back_to=self.checkpoints.saved_generation_number(),
            )
        except LostOwnership:
            return RunOutcome.LOST_OWNERSHIP
        return RunOutcome.FAILED if give_up else RunOutcome.RETRYING

    def after_storage_fault(self, exc: StorageError, record: SliceRecord) -> RunOutcome:
        """The checkpoint storage failed: the job goes back to its queue from its last good
        checkpoint, its failure count untouched, and this worker backs off.

        Unless the fault follows the job. Right after the fault, the store is probed with a
        small synced write (Runtime.count_storage_fault): if it takes that, it works for everyone
        but this job (a state it has no room for, say), and the fault counts toward the job; if
        not, the store is failing and nothing is counted. At CLOCKQ_JOB_STORAGE_FAULTS counted
        faults the fault is the job's: it fails, and the worker, whose store works, is not
        marked degraded for it."""
        log.warning("job %s: %s", self.job_id, exc)
        self.roll_back()
        counted = self.stores.count_storage_fault(self.job_id)
        store_works = counted is not None
        faults = counted or 0
        limit = settings.CLOCKQ_JOB_STORAGE_FAULTS
        the_jobs = faults >= limit
        generation = self.checkpoints.saved_generation()
        if the_jobs:
            to, outcome = JobState.FAILED, RunOutcome.FAILED
            reason = (
                f"the checkpoint storage failed under this job {faults} times while it took other "
                f"writes (CLOCKQ_JOB_STORAGE_FAULTS={limit}): the fault follows the job, so it is the job's; "
                f"its last good checkpoint is generation {generation}: {exc}"
            )
            extra: dict[str, Any] = {"last_error": reason, "finished_at": timezone.now()}
        else:
            to, outcome = JobState.QUEUED, RunOutcome.STORAGE_FAULT
            following = (
                f"storage fault {faults} of {limit} met while the store took other writes"
                if store_works
                else "the store takes no writes at all"
            )
            reason = (
                f"checkpoint storage failed ({exc}); not charged to the job's retries ({following}), "
                f"back in the queue from checkpoint generation {generation}"
            )
            extra = {}
        try:
            self.writes.end(
                record,
                SliceOutcome.FAULT,
                to,
                reason[:1000],
                extra,
                rolled_back_to=self.checkpoints.saved_generation_number(),
            )
        except LostOwnership:
            return RunOutcome.LOST_OWNERSHIP
        if not the_jobs:
            self.stores.storage_failed(str(exc))
        return outcome

    def fail_at_once(self, exc: Exception, record: SliceRecord) -> RunOutcome:
        """The job cannot run as things are: its state outgrew its owner's storage quota, or this
        worker refuses it (JobRefused). Retrying would only fail again, so it fails now, keeping
        its last good checkpoint; an operator can fix the cause and requeue it."""
        log.warning("job %s: %s", self.job_id, exc)
        self.roll_back()
        try:
            self.writes.end(
                record,
                SliceOutcome.FAILED,
                JobState.FAILED,
                str(exc)[:1000],
                {"last_error": str(exc), "finished_at": timezone.now()},
                rolled_back_to=self.checkpoints.saved_generation_number(),
            )
        except LostOwnership:
            return RunOutcome.LOST_OWNERSHIP
        return RunOutcome.FAILED
