"""Run a job in time slices: claim, restore, step until the slice is used up, then decide.

At each slice boundary the job finishes, continues (nothing to make way for), or checkpoints
and goes back to the tail of its tier's queue. Every database write is a compare-and-set on
(state, dispatch token), so a stale or duplicate message can never run a job twice.
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F
from django.utils import timezone
from redis import RedisError

from clockq.policy.slicing import (
    Boundary,
    BoundaryAction,
    SliceOutcome,
    decide_at_boundary,
    plan_slice_ms,
    waiting_ahead,
)
from clockq.policy.states import JobState
from webapp.models import Job, JobEvent, QueueTier, Slice
from webapp.transitions import transition
from workers import broker, shutdown
from workers.checkpoints import CheckpointStore
from workers.workloads import registry
from workers.workloads.base import RunContext, Workload

log = logging.getLogger("clockq.slices")

RUNNING = JobState.RUNNING


@dataclass(frozen=True)
class WorkerIdentity:
    hostname: str  # gpu<N>@<host>
    gpu_index: int


@dataclass
class SliceRecord:
    started_at: datetime
    planned_ms: int
    used_ms: float = 0.0
    steps: int = 0
    restore_ms: float = 0.0
    checkpoint_bytes: int = 0
    checkpoint_ms: float = 0.0


class LostOwnership(Exception):
    """The job was cancelled, or re-dispatched elsewhere, while this worker ran it."""


class SliceFailed(Exception):
    """The workload (or its checkpoint) raised; the job rolls back to its last checkpoint."""


@contextmanager
def workload_errors() -> Iterator[None]:
    """Turn any error from workload code into SliceFailed, so that infrastructure errors
    (database, broker) are never counted against the job."""
    try:
        yield
    except Exception as exc:
        raise SliceFailed(repr(exc)) from exc


def run_dispatch(job_id: int, token: str, worker: WorkerIdentity, store: CheckpointStore | None = None) -> str:
    """Handle one dispatch message. Returns a short word saying what happened, for logs."""
    store = store or CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR)
    job = claim_job(job_id, token, worker)
    if job is None:
        return "stale"
    return JobRun(job, worker, store).run()


def claim_job(job_id: int, token: str, worker: WorkerIdentity) -> Job | None:
    """Take a queued job for this worker, or return None if the message is stale."""
    job = Job.objects.filter(pk=job_id).only("state", "dispatch_token", "enqueued_at", "deadline").first()
    if job is None or job.state != JobState.QUEUED or job.dispatch_token != token:
        log.info("job %s: dropping stale message (token %s)", job_id, token[:8])
        return None
    now = timezone.now()
    if job.deadline and now >= job.deadline:
        transition(
            job_id,
            to=JobState.TIMED_OUT,
            expect={JobState.QUEUED},
            token=token,
            reason="deadline passed before the job could start",
            actor=worker.hostname,
            updates={"finished_at": now},
        )
        return None
    waited_ms = int((now - job.enqueued_at).total_seconds() * 1000) if job.enqueued_at else 0
    return transition(
        job_id,
        to=RUNNING,
        expect={JobState.QUEUED},
        token=token,
        reason=f"claimed on GPU {worker.gpu_index}",
        actor=worker.hostname,
        updates={
            "worker": worker.hostname,
            "wait_ms": F("wait_ms") + max(waited_ms, 0),
            "first_started_at": job.first_started_at if job.first_started_at else now,
        },
    )


class JobRun:
    """One claim of one job on one worker: from restore to finish, yield or failure."""

    def __init__(self, job: Job, worker: WorkerIdentity, store: CheckpointStore):
        self.job = job
        self.worker = worker
        self.store = store
        self.token = job.dispatch_token
        self.generation = job.checkpoint_generation
        self.progress = job.progress
        # What the database holds as the last good checkpoint; a failure rolls back to it.
        self.saved_generation = job.checkpoint_generation
        self.saved_progress = job.progress
        self.last_checkpoint_at = time.monotonic()
        self.tier_ranks = dict(QueueTier.objects.values_list("id", "rank"))

    def run(self) -> str:
        record = SliceRecord(timezone.now(), self._plan_ms())
        workload = None
        try:
            t0 = time.perf_counter()
            workload = self._restore()
            record.restore_ms = (time.perf_counter() - t0) * 1000
            while True:
                done = self._run_slice(workload, record)
                outcome = self._at_boundary(workload, record, done)
                if outcome != "continued":
                    return outcome
                record = SliceRecord(timezone.now(), self._plan_ms())
        except LostOwnership as exc:
            log.info("job %s: stopping, %s", self.job.pk, exc)
            return "lost-ownership"
        except SliceFailed as exc:
            return self._after_failure(exc.__cause__ or exc, record)
        finally:
            if workload is not None:
                try:
                    workload.close()
                except Exception:
                    log.exception("job %s: workload close failed", self.job.pk)

    # --- the slice -------------------------------------------------------------------------

    def _plan_ms(self) -> int:
        tier = self.job.tier
        return plan_slice_ms(tier.base_slice_ms, tier.min_slice_ms)

    def _restore(self) -> Workload:
        with workload_errors():
            workload = registry.create(self.job.workload, self.job.params)
            workload.setup(RunContext(self.job.pk, self.worker.gpu_index, self.store.work_dir(self.job.pk)))
        if self.generation:
            restored = self.store.restore(self.job.pk, self.generation)
            if restored.generation != self.generation:
                self._note(
                    f"checkpoint generation {self.generation} unusable ({'; '.join(restored.skipped)}); "
                    + (
                        f"restored generation {restored.generation}"
                        if restored.state is not None
                        else "no good checkpoint left, restarting from the beginning"
                    )
                )
                self.generation = restored.generation
            if restored.state is not None:
                with workload_errors():
                    workload.load_state_dict(restored.state)
        return workload

    def _run_slice(self, workload: Workload, record: SliceRecord) -> bool:
        start = time.perf_counter()
        budget_s = record.planned_ms / 1000.0
        done = False
        try:
            with workload_errors():
                while True:
                    progress = float(workload.step())
                    if not math.isfinite(progress):
                        raise ValueError(f"step() returned {progress}, not a progress in [0, 1]")
                    record.steps += 1
                    self.progress = min(max(progress, 0.0), 1.0)
                    if self.progress >= 1.0:
                        done = True
                        break
                    if time.perf_counter() - start >= budget_s:
                        break
        finally:
            record.used_ms = (time.perf_counter() - start) * 1000
        return done

    # --- the boundary ------------------------------------------------------------------------

    def _at_boundary(self, workload: Workload, record: SliceRecord, done: bool) -> str:
        row = Job.objects.filter(pk=self.job.pk).values("state", "dispatch_token", "pending_action", "tier_id").first()
        if row is None or row["state"] != RUNNING or row["dispatch_token"] != self.token:
            raise LostOwnership(f"job is now {row['state'] if row else 'deleted'}")
        rank = self.tier_ranks.get(row["tier_id"], self.job.tier.rank)
        decision = decide_at_boundary(
            Boundary(
                done=done,
                job_rank=rank,
                waiting_by_rank=[] if done else self._waiting_by_rank(rank),
                pending_action=row["pending_action"],
                past_deadline=bool(self.job.deadline and timezone.now() >= self.job.deadline),
                shutting_down=shutdown.requested.is_set(),
            )
        )
        action = decision.action
        if action == BoundaryAction.FINISH:
            self._end(
                record,
                SliceOutcome.COMPLETED,
                JobState.SUCCEEDED,
                decision.reason,
                {"finished_at": timezone.now(), "progress": 1.0},
            )
            return "succeeded"
        if action == BoundaryAction.CONTINUE:
            self._continue(workload, record)
            return "continued"
        self._checkpoint(workload, record)
        target = {
            BoundaryAction.YIELD: JobState.QUEUED,
            BoundaryAction.HOLD: JobState.HELD,
            BoundaryAction.TIME_OUT: JobState.TIMED_OUT,
        }[action]
        extra = {"finished_at": timezone.now()} if target == JobState.TIMED_OUT else {}
        self._end(record, SliceOutcome.YIELDED, target, decision.reason, extra)
        return str(target)

    def _waiting_by_rank(self, rank: int) -> list[int]:
        """Jobs waiting per tier. The broker's queue lengths are the cheap first look; when they
        say someone waits, the database confirms it, because the broker may also hold stale or
        duplicate messages that would cause a needless switch."""
        try:
            waiting = broker.waiting_by_rank()
        except RedisError as exc:
            # With the broker down nothing can be dispatched anyway: keep the GPU busy.
            log.warning("job %s: cannot read queue lengths (%s); continuing", self.job.pk, exc)
            return []
        if not waiting_ahead(rank, waiting):
            return waiting
        counts = dict(
            Job.objects.filter(state=JobState.QUEUED, tier__rank__lte=rank)
            .values_list("tier__rank")
            .annotate(n=Count("id"))
        )
        return [counts.get(r, 0) for r in range(len(waiting))]

    def _continue(self, workload: Workload, record: SliceRecord) -> None:
        every = settings.CLOCKQ_CHECKPOINT_EVERY_S
        checkpointed = bool(every) and time.monotonic() - self.last_checkpoint_at >= every
        if checkpointed:
            self._checkpoint(workload, record)
        with transaction.atomic():
            updated = Job.objects.filter(pk=self.job.pk, state=RUNNING, dispatch_token=self.token).update(
                progress=self.progress,
                run_ms=F("run_ms") + int(record.used_ms),
                slice_count=F("slice_count") + 1,
                checkpoint_generation=self.generation,
            )
            if updated != 1:
                raise LostOwnership("job changed under this worker")
            self._save_slice(record, SliceOutcome.CONTINUED)
        if checkpointed:
            self.saved_generation, self.saved_progress = self.generation, self.progress

    def _checkpoint(self, workload: Workload, record: SliceRecord) -> None:
        t0 = time.perf_counter()
        with workload_errors():
            state = workload.state_dict()
            record.checkpoint_bytes = self.store.write(self.job.pk, self.generation + 1, state)
        record.checkpoint_ms = (time.perf_counter() - t0) * 1000
        self.generation += 1
        self.last_checkpoint_at = time.monotonic()

    def _end(self, record: SliceRecord, outcome: SliceOutcome, to: JobState, reason: str, extra: dict) -> None:
        """Leave RUNNING, with the slice recorded in the same transaction."""
        with transaction.atomic():
            job = transition(
                self.job.pk,
                to=to,
                expect={RUNNING},
                token=self.token,
                reason=reason,
                actor=self.worker.hostname,
                rotate_token=to == JobState.QUEUED or to == JobState.HELD,
                updates={
                    "progress": self.progress,
                    "run_ms": F("run_ms") + int(record.used_ms),
                    "slice_count": F("slice_count") + 1,
                    "checkpoint_generation": self.generation,
                    **extra,
                },
            )
            if job is None:
                raise LostOwnership("job changed under this worker")
            self._save_slice(record, outcome)

    def _save_slice(self, record: SliceRecord, outcome: SliceOutcome) -> None:
        Slice.objects.create(
            job_id=self.job.pk,
            worker=self.worker.hostname,
            gpu_index=self.worker.gpu_index,
            started_at=record.started_at,
            ended_at=timezone.now(),
            planned_ms=record.planned_ms,
            used_ms=int(record.used_ms),
            steps=record.steps,
            outcome=outcome,
            checkpoint_bytes=record.checkpoint_bytes,
            checkpoint_ms=record.checkpoint_ms,
            restore_ms=record.restore_ms,
        )

    # --- failure -----------------------------------------------------------------------------

    def _after_failure(self, exc: Exception, record: SliceRecord) -> str:
        error = "".join(traceback.format_exception(exc, limit=8))[-4000:]
        log.warning("job %s: workload raised %r", self.job.pk, exc)
        failures = Job.objects.filter(pk=self.job.pk).values_list("failures", flat=True).first() or 0
        failures += 1
        limit = settings.CLOCKQ_MAX_RETRIES
        give_up = failures > limit
        to = JobState.FAILED if give_up else JobState.QUEUED
        reason = (
            f"failed {failures} time(s), over the retry limit of {limit}: {exc!r}"[:1000]
            if give_up
            else f"rolled back to checkpoint generation {self.saved_generation} after {exc!r}; "
            f"retry {failures} of {limit}"[:1000]
        )
        # The failed slice's own work is discarded: progress and generation go back to the
        # last checkpoint the database knows.
        self.generation = self.saved_generation
        self.progress = self.saved_progress
        try:
            self._end(
                record,
                SliceOutcome.FAILED,
                to,
                reason,
                {
                    "failures": failures,
                    "last_error": error,
                    **({"finished_at": timezone.now()} if give_up else {}),
                },
            )
        except LostOwnership:
            return "lost-ownership"
        return "failed" if give_up else "retrying"

    def _note(self, reason: str) -> None:
        JobEvent.objects.create(
            job_id=self.job.pk, from_state=RUNNING, to_state=RUNNING, reason=reason[:2000], actor=self.worker.hostname
        )
