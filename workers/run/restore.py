"""Bring a claimed job's workload onto the GPU: warm from this worker's cache, or set up afresh
and loaded from its checkpoint.

A cold restore can take seconds (a framework import, a model build, a wait for another worker's
persist of a big state), so it asks before each slow part whether an urgent job (RT, HP) takes the GPU
instead, and gives way (RestoreAbandoned) when it should.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.db import transaction
from redis import RedisError

from clockq.bus import persists
from clockq.bus.client import client
from clockq.jobs.checkpoints import RestoreAbandoned, StorageError, generation_label, is_checkpoint_name
from clockq.jobs.models import Job, Slice
from clockq.policy.states import JobState
from workers.run.checkpointer import Checkpointer
from workers.run.claim import ClaimedJob
from workers.run.errors import LostOwnership, workload_errors
from workers.run.metrics_recorder import MetricsRecorder
from workers.runtime import WorkerIdentity, WorkerStores
from workers.storage_watch import JobStorage
from workers.workloads import registry
from workers.workloads.base import RunContext, Workload

log = logging.getLogger("clockq.slices")


class Restore:
    """One claim's restore of its job's workload; `urgent_takes_gpu` says when to give way."""

    def __init__(
        self,
        job: ClaimedJob,
        identity: WorkerIdentity,
        stores: WorkerStores,
        *,
        checkpoints: Checkpointer,
        metrics: MetricsRecorder,
        urgent_takes_gpu: Callable[[], bool],
        note: Callable[[str], None],
    ):
        self.job = job
        self.job_id = job.id
        self.token = job.dispatch_token
        self.identity = identity
        self.stores = stores
        self.checkpoints = checkpoints
        self.metrics = metrics
        self.urgent_takes_gpu = urgent_takes_gpu
        self.note = note  # records an event on the job

    def workload(self) -> Workload:
        """The job's workload, at the checkpoint the database names (or the newest good one)."""
        files = self.checkpoints.files
        current = files[0] if files else None
        warm = self.stores.warm.take(self.job_id, current) if current else None
        if warm is not None:
            # The same job came back to this worker, still at the checkpoint it left, with the
            # curves saved with that checkpoint. Its snapshot may still be copied out of it.
            self.stores.persister.settle(self.job_id)
            self.metrics.adopt(warm.curves)
            return warm.workload
        # A cold restore: the workload's setup (a framework import, a model build, its memory)
        # and the checkpoint's read can take seconds, and an urgent job must not wait for them.
        if current and self.urgent_takes_gpu():
            raise RestoreAbandoned("before its setup")
        work_dir = self.stores.store.work_dir(self.job_id)
        with workload_errors():
            workload = registry.create(self.job.workload, self.job.params)
            workload.setup(
                RunContext(
                    self.job_id,
                    self.identity.gpu_index,
                    work_dir,
                    settings.CLOCKQ_CACHE_DIR,
                    storage=JobStorage(self.job_id),
                )
            )
        if current:
            try:
                if self.urgent_takes_gpu():
                    raise RestoreAbandoned("after its setup, before reading its checkpoint")
                state = self._read_checkpoint(current)
            except (StorageError, RestoreAbandoned):
                close_workload(workload, self.job_id)
                raise
            if state is not None:
                with workload_errors():
                    workload.load_state_dict(state)
        return workload

    def _read_checkpoint(self, current: str) -> bytes | None:
        """The state the database names, or the newest good one before it (saying why)."""
        state = self.stores.persister.pending(self.job_id, current)
        if state is not None:
            return state  # this worker took the snapshot and has yet to write it
        files = self.checkpoints.files
        names = [name for name in files if is_checkpoint_name(name)]
        restored = self.stores.store.restore(
            self.job_id,
            names,
            wait_s=settings.CLOCKQ_PERSIST_WAIT_S,
            writer_of=self._writer_of,
            abandon=self.urgent_takes_gpu,
        )
        if restored.name == current:
            return restored.state
        bad = [name for name in files if name not in names]
        reasons = list(restored.skipped) + [f"{name!r} is not a checkpoint name" for name in bad]
        fallback = (
            f"restored generation {restored.generation}"
            if restored.name
            else "no good checkpoint left, restarting from the beginning"
        )
        kept = files[files.index(restored.name) :] if restored.name else []
        with transaction.atomic():
            # Take the unusable ones off the job now, so the next claim does not wait for them too.
            if not Job.objects.filter(pk=self.job_id, state=JobState.RUNNING, dispatch_token=self.token).update(
                checkpoint_files=kept
            ):
                raise LostOwnership("job changed under this worker")
            # Noted with the change, not before it: a claim that lost the job meanwhile (its lease
            # ran out during the wait for the writer) leaves the files to the next claim, which
            # notes them once.
            self.note(f"checkpoint generation {generation_label(current)} unusable ({'; '.join(reasons)}); {fallback}")
            # The steps of the slices that only the unusable ones held are run again: their rows
            # say so, or the job's slices would count those steps twice.
            Slice.objects.roll_back_to(self.job_id, restored.generation)
        self.checkpoints.fall_back(kept)
        return restored.state

    def _writer_of(self, name: str) -> str | None:
        """The worker still writing this checkpoint of the job, if any (clockq/bus/persists.py)."""
        try:
            return persists.writer_of(client(), self.job_id, name)
        except RedisError as exc:
            return f"(unknown: the broker cannot be read: {exc})"  # wait, up to the bound


def close_workload(workload: Workload, job_id: int) -> None:
    try:
        workload.close()
    except Exception:
        log.exception("job %s: workload close failed", job_id)
