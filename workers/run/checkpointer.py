"""A job's checkpoints as one claim keeps them: snapshot, name, persist, and roll back.

A checkpoint is snapshotted into host memory and named on the job by the caller's
ownership-checked update; only after that commits is it written, in the background, so the GPU
does not wait for the disk. Generations are numbered from the highest ever named, and never
reused: not after a fallback, not after a rollback (clockq/jobs/checkpoints.py).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.conf import settings

from clockq.bus import persists
from clockq.jobs import quotas, workloads
from clockq.jobs.checkpoints import (
    KEEP_GENERATIONS,
    checkpoint_name,
    generation_label,
    generation_of,
    is_checkpoint_name,
)
from workers.persister import POPULATE_FROM_BYTES, Persist, Snapshot
from workers.run.claim import ClaimedJob
from workers.run.errors import workload_errors
from workers.runtime import WorkerStores
from workers.workloads.base import Workload


class Checkpointer:
    """The newest checkpoint this claim has named, and the last one the database holds."""

    def __init__(self, job: ClaimedJob, stores: WorkerStores):
        self.job = job
        self.job_id = job.id
        self.token = job.dispatch_token
        self.stores = stores
        self.generation = job.checkpoint_generation
        self.files: list[str] = list(job.checkpoint_files or [])  # restore candidates, newest first
        self.nbytes = job.checkpoint_bytes  # size of the newest checkpoint
        # What the database holds as the last good checkpoint; a failure rolls back to it.
        self.saved_files = list(self.files)
        self.saved_progress = job.progress
        self.saved_nbytes = self.nbytes
        self.last_at = time.monotonic()
        self.unpersisted: tuple[str, Snapshot] | None = None  # a snapshot taken, until its name commits

    def next_name(self) -> str:
        return checkpoint_name(self.generation + 1, self.token)

    def due(self) -> bool:
        """Whether a periodic checkpoint is due at a boundary where the job continues."""
        every = settings.CLOCKQ_CHECKPOINT_EVERY_S
        due = bool(every) and time.monotonic() - self.last_at >= every
        # While checkpoints cannot be written the job keeps its work on the GPU, not on a disk.
        return due and not self.stores.checkpoints_failing(self.nbytes)

    def reserve_memory(self) -> None:
        """A job with a big state gets a snapshot buffer made ready while it runs, in the
        background, so that an RT job preempting it does not wait for the memory to be mapped."""
        nbytes = self.nbytes or workloads.declared_state_bytes(self.job.workload, self.job.params)
        snapshots = self.stores.snapshots
        if nbytes >= POPULATE_FROM_BYTES and not snapshots.ready_for(nbytes):  # no thread per claim
            threading.Thread(target=snapshots.reserve, args=(nbytes,), name="clockq-reserve", daemon=True).start()

    def take(
        self, workload: Workload, park: bool = False, marked_ahead: tuple[str, float] | None = None
    ) -> tuple[int, float]:
        """Snapshot the state into host memory and name the next generation; its size and the
        time it took. The caller's update then names it on the job, and `persist` writes it.
        `marked_ahead`: the persist mark the boundary's read set ahead (`Decided.marked`).

        With `park` (the job yields to its queue, and its workload waits in the warm cache,
        unchanged), the copy into host memory is made in the background too, so the GPU does
        not wait for it either; the workload is neither stepped nor closed before the copy is
        done (Persister.settle)."""
        t0 = time.perf_counter()
        with workload_errors():
            state = workload.snapshot()
            chunks = [state] if isinstance(state, bytes | bytearray | memoryview) else list(state)
            nbytes = sum(memoryview(c).nbytes for c in chunks)
        if nbytes > self.nbytes:
            # The state grew (or this is the first checkpoint): does the owner have room for it?
            quotas.check_checkpoint(self.job_id, self.job.owner_id, nbytes)
        name = self.next_name()
        persister = self.stores.persister
        # After a failed persist, write the next one at once, so the storage is tried again now.
        snapshot = None if persister.take_failure(self.job_id) else self.stores.snapshots.take(state, background=park)
        if snapshot is not None and not _marked_ahead(marked_ahead, name) and not persister.mark(self.job_id, name):
            self.stores.snapshots.release(snapshot)  # a claim elsewhere could not tell it is coming
            snapshot = None
        if snapshot is None:
            # Over the snapshot memory bound, or the previous persist failed, or no mark: write it
            # now. Outside workload_errors: a storage failure raises StorageError, not the job's.
            self.stores.store.write(self.job_id, name, state)
            self.stores.storage_works()
        self.unpersisted = (name, snapshot) if snapshot is not None else None
        took_ms = (time.perf_counter() - t0) * 1000
        self.generation += 1
        self.files = _names_to_keep([name, *self.files], persister.unwritten(self.job_id))
        self.nbytes = nbytes
        self.last_at = time.monotonic()
        return nbytes, took_ms

    def fields(self) -> dict[str, Any]:
        """The job's columns that name its checkpoints, for the update that ends a slice."""
        return {
            "checkpoint_generation": self.generation,
            "checkpoint_files": self.files,
            "checkpoint_bytes": self.nbytes,
        }

    def persist(self) -> None:
        """The update naming the new checkpoint committed: write it, or, if it was written
        before the update, prune what it replaces."""
        unpersisted, self.unpersisted = self.unpersisted, None
        if unpersisted is not None:
            name, snapshot = unpersisted
            self.stores.persister.submit(Persist(self.job_id, name, snapshot, tuple(self.files)))
        else:
            self.stores.store.prune(self.job_id, self.files)

    def keep(self, progress: float) -> None:
        """The newest checkpoint, at `progress`, is now the last good one the database holds."""
        self.saved_files, self.saved_progress = list(self.files), progress
        self.saved_nbytes = self.nbytes

    def discard_snapshot(self) -> None:
        """The checkpoint was never named (the job was lost or rolled back): free its memory."""
        unpersisted, self.unpersisted = self.unpersisted, None
        if unpersisted is not None:
            name, snapshot = unpersisted
            self.stores.snapshots.release(snapshot)
            self.stores.persister.unmark(self.job_id, name)

    def fall_back(self, kept: list[str]) -> None:
        """The restore found the newest checkpoints unusable: the job now names only `kept`."""
        self.files = self.saved_files = kept

    def roll_back(self) -> float:
        """Back to the files the database names; the generation number stays, never reused. The
        progress they were taken at."""
        self.discard_snapshot()
        self.files = list(self.saved_files)
        self.nbytes = self.saved_nbytes
        return self.saved_progress

    def saved_generation(self) -> int | str:
        return generation_label(self.saved_files[0]) if self.saved_files else 0

    def saved_generation_number(self) -> int | None:
        """The generation of the last good checkpoint the database holds (0: none), or None when
        its name names none."""
        if not self.saved_files:
            return 0
        return generation_of(self.saved_files[0]) if is_checkpoint_name(self.saved_files[0]) else None


def _marked_ahead(marked: tuple[str, float] | None, name: str) -> bool:
    """Whether the boundary's read, during the last step, already marked `name`, recently
    enough that the mark outlives the update that names it (its persist then refreshes it)."""
    return marked is not None and marked[0] == name and time.monotonic() - marked[1] < persists.TTL_S / 2


def _names_to_keep(names: list[str], unwritten: set[str]) -> list[str]:
    """The newest checkpoint and those before it, back to a written one to fall back to (and
    KEEP_GENERATIONS in all, at least): names this worker has yet to write are not enough."""
    kept: list[str] = []
    for name in names:
        kept.append(name)
        if len(kept) >= KEEP_GENERATIONS and name not in unwritten:
            break
    return kept
