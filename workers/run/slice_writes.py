"""The writes that end a slice: each one a compare-and-set on (RUNNING, dispatch token).

The job's progress, run time and checkpoints, the slice's own row, and a promoted job's return
to its tier are written in one transaction, so that what the database says happened to a slice
never disagrees with the job. Another process changed the job first (it was cancelled, or the
reaper took it back): LostOwnership, and nothing is written.
"""

from __future__ import annotations

from concurrent.futures import Executor
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from clockq.bus import counters
from clockq.jobs import hot_sql, order
from clockq.jobs.models import Job, JobEvent, Slice
from clockq.jobs.transitions import transition
from clockq.policy.slicing import SliceOutcome
from clockq.policy.states import JobState
from workers.lease import lease_until
from workers.run.checkpointer import Checkpointer
from workers.run.claim import ClaimedJob
from workers.run.errors import LostOwnership
from workers.run.metrics_recorder import MetricsRecorder
from workers.run.state import RunState
from workers.run.steps import SliceRecord
from workers.run.tiers import RunTiers
from workers.runtime import WorkerIdentity

RUNNING = JobState.RUNNING


class SliceWrites:
    """What one claim writes of its job, slice by slice, from the parts that hold it."""

    def __init__(
        self,
        job: ClaimedJob,
        identity: WorkerIdentity,
        *,
        counter_writer: Executor,
        tiers: RunTiers,
        checkpoints: Checkpointer,
        state: RunState,
        metrics: MetricsRecorder,
    ):
        self.job_id = job.id
        self.owner_id = job.owner_id
        self.token = job.dispatch_token
        self.identity = identity
        self.counter_writer = counter_writer  # writes the slice counters off the GPU's path
        self.tiers = tiers
        self.checkpoints = checkpoints
        self.state = state  # read here (the job's progress and GPU use); JobRun writes it
        self.metrics = metrics

    def end(
        self,
        record: SliceRecord,
        outcome: SliceOutcome,
        to: JobState,
        reason: str,
        extra: dict,
        *,
        rolled_back_to: int | None = None,
    ) -> None:
        """Leave RUNNING, with the slice recorded in the same transaction. With `rolled_back_to`
        (a generation, 0: none), the job went back to that checkpoint: this slice and those
        after the one that took it are marked rolled back."""
        updates = {**self._progress_fields(record), **extra}  # before the return is noted
        with transaction.atomic():
            self._count_service(record)
            self._note_return()
            changed = transition(
                self.job_id,
                to=to,
                expect={RUNNING},
                token=self.token,
                reason=reason,
                actor=self.identity.hostname,
                rotate_token=to in (JobState.QUEUED, JobState.HELD),
                updates=updates,
                queue_name=self.tiers.current.queue_name,
            )
            if changed is None:
                raise LostOwnership("job changed under this worker")
            if outcome in (SliceOutcome.YIELDED, SliceOutcome.COMPLETED):
                self.metrics.save()  # checkpointed or finished; a failed slice's are rolled back
            self._save_slice(record, outcome)
            if rolled_back_to is not None:
                Slice.objects.roll_back_to(self.job_id, rolled_back_to)

    def continued(self, record: SliceRecord, *, checkpointed: bool) -> None:
        """Stay RUNNING for another slice: renew the lease, and record this one."""
        now = timezone.now()
        with transaction.atomic():
            updated = hot_sql.update(
                Job,
                {"id": self.job_id, "state": RUNNING, "dispatch_token": self.token},
                {**self._progress_fields(record), "lease_expires_at": lease_until(), "slice_started_at": now},
            )
            if updated != 1:
                raise LostOwnership("job changed under this worker")
            self._count_service(record)
            self._note_return()
            if checkpointed:
                self.metrics.save()
            # The next slice starts where this one ends, so a slice lost later never overlaps it.
            self._save_slice(record, SliceOutcome.CONTINUED, ended_at=now)

    def note(self, reason: str) -> None:
        """An event in the job's history that changes no state."""
        JobEvent.objects.create(
            job_id=self.job_id,
            from_state=RUNNING,
            to_state=RUNNING,
            reason=reason[:2000],
            actor=self.identity.hostname,
        )

    def _progress_fields(self, record: SliceRecord) -> dict[str, Any]:
        fields = {
            "progress": self.state.progress,
            "run_ms": F("run_ms") + int(record.used_ms),
            "slice_count": F("slice_count") + 1,
            **self.checkpoints.fields(),
            "util_ewma": self.state.util_ewma,
        }
        if self.tiers.returning_from is not None:
            fields["tier_id"] = self.tiers.home.id
            fields["promoted_run_ms"] = None
            fields["level_from_ms"] = 0
        return fields

    def _count_service(self, record: SliceRecord) -> None:
        """The slice's service in its owner's share of the tier it was scheduled in (fair share)."""
        tier = self.tiers.returning_from or self.tiers.current
        order.add_service(self.owner_id, tier.id, record.used_ms, timezone.now())

    def _note_return(self) -> None:
        """In the transaction that wrote the return."""
        if self.tiers.returning_from is not None:
            home, there = self.tiers.home.code, self.tiers.returning_from.code
            self.note(f"returned to {home} after {self.tiers.served_ms / 1000:.1f} s of service in {there}")
            self.tiers.returning_from = None

    def _save_slice(self, record: SliceRecord, outcome: SliceOutcome, ended_at: datetime | None = None) -> None:
        hot_sql.insert(
            Slice,
            {
                "job_id": self.job_id,
                "worker": self.identity.hostname,
                "gpu_index": self.identity.gpu_index,
                "started_at": record.started_at,
                "ended_at": ended_at or timezone.now(),
                "planned_ms": record.plan.ms,
                "plan_reason": record.plan.reason,
                "used_ms": int(record.used_ms),
                "steps": record.steps,
                "outcome": outcome,
                "checkpoint_bytes": record.checkpoint_bytes,
                "checkpoint_ms": record.checkpoint_ms,
                "restore_ms": record.restore_ms,
                "paused_ms": record.paused_ms,
                "gpu_util": record.gpu_util,
                "last_step": self.metrics.last_step,
                "preempted": record.preempted,
                "checkpoint_generation": record.checkpoint_generation,
            },
        )
        switched = outcome == SliceOutcome.YIELDED
        counters.count_slice(
            tier=self.tiers.home.code,
            outcome=outcome,
            used_ms=int(record.used_ms),
            switch_ms=record.checkpoint_ms + record.restore_ms if switched else None,
            writer=self.counter_writer,
        )
