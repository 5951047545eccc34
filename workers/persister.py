"""Snapshot, then persist: a checkpoint in two phases, so the GPU does not wait for the disk.

The idea is CheckFreq's (FAST '21). At a slice boundary the worker takes a *snapshot*: the
workload's state copied into host memory (on a real GPU, the copy from the device). The
ownership-checked update of the job names the new checkpoint file, the job is requeued and the
GPU goes to the next job. A background thread then *persists* the snapshot: write, fsync,
rename (clockq/jobs/checkpoints.py).

What keeps this safe:

- A file appears under its name only once complete, so a claim never restores a half-written
  generation. A worker that claims a job whose newest checkpoint is still on its way waits for
  it, with a bound, then falls back to the one before (CheckpointStore.restore).
- The job always names a durable generation to fall back to: the list of names the database
  holds reaches back to the newest one written (workers/run/checkpointer.py keeps it so). A
  worker that dies with persists in flight loses those generations, and only those: the job
  resumes from the newest one on disk, and its history says why.
- Snapshots in flight hold at most CLOCKQ_SNAPSHOT_MEMORY_MB of host memory. When the bound is
  reached, the next checkpoint is written before the GPU is handed over, as it was before.
- A worker that stops (SIGTERM) flushes its persists before it exits (`flush`).
- Each persist in flight has a mark in Redis (clockq/bus/persists.py), set before the database
  names the file and kept fresh while it is written, so a claim waits only for a writer that is
  still alive. Without the mark (the broker cannot be reached), the checkpoint is written before
  the GPU is handed over.
"""

from __future__ import annotations

import logging
import mmap
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import redis
from redis import RedisError

from clockq.bus import persists
from clockq.jobs.checkpoints import CheckpointStore, StorageError

log = logging.getLogger("clockq.persist")

Buffer = bytes | bytearray | memoryview
Pooled = bytearray | mmap.mmap  # a snapshot buffer the pool keeps
# Buffers from this size up are mapped with their pages populated up front, in one system call
# that releases the GIL, instead of faulting them in during the copy.
POPULATE_FROM_BYTES = 8 * 2**20
# A background copy starts a thread (0.12-0.17 ms here); below this size the copy itself is
# quicker (0.025 ms for 1 MB into a reused buffer), so it is made at once.
BACKGROUND_COPY_FROM_BYTES = 4 * 2**20
# How long a write waits, at most, for the next job to start after a switch (Persister.pause).
SWITCH_QUIET_S = 0.1


@dataclass
class Snapshot:
    """A workload's state in host memory, as chunks that nothing will change any more, once
    copied: a copy made in the background (`take(..., background=True)`) may still be on its way
    until `wait()` returns."""

    chunks: list[Buffer]
    nbytes: int
    _buffers: list[Pooled] = field(default_factory=list)  # pooled copies, given back after
    _copied: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None  # what went wrong with the copy, if anything

    def wait_copied(self) -> None:
        """Until the copy is done, whatever became of it."""
        self._copied.wait()

    def wait(self) -> None:
        """Until the copy is done; raises what went wrong with it."""
        self.wait_copied()
        if self.error is not None:
            raise StorageError(f"snapshot copy failed: {self.error!r}") from self.error

    def join(self) -> bytes:
        self.wait()
        return b"".join(self.chunks)


class SnapshotMemory:
    """Host memory for snapshots, bounded. Copies go into buffers that are kept and reused, the
    way pinned host buffers are for device copies: a fresh allocation of this size would be
    dominated by page faults, several times the copy into a buffer already touched. `reserve`
    makes one ready before it is needed."""

    def __init__(self, max_bytes: int, background_from: int = BACKGROUND_COPY_FROM_BYTES):
        self.max_bytes = max_bytes
        self.background_from = background_from  # smaller snapshots are copied at once
        self.in_flight = 0  # bytes held by snapshots not yet persisted
        self.peak = 0
        self._free: list[Pooled] = []
        self._lock = threading.Lock()

    def reserve(self, nbytes: int) -> bool:
        """Make sure a free buffer for a snapshot of `nbytes` is ready, allocated and touched in
        advance, if the bound allows it. A worker calls it from a thread when it claims a job
        with a big state, so that the job's first preemption copies into memory already mapped
        (an RT job waits for that copy). True if one is ready."""
        if self.ready_for(nbytes):
            return True
        with self._lock:
            if nbytes <= 0 or self._held() + nbytes > self.max_bytes:
                return False
        buffer = _allocate(nbytes)  # outside the lock: this is the slow part
        with self._lock:
            if self._held() + len(buffer) > self.max_bytes:
                return False  # snapshots took the room meanwhile
            self._free.append(buffer)
        return True

    def ready_for(self, nbytes: int) -> bool:
        """Whether a free buffer would take a snapshot of `nbytes` without a new allocation."""
        with self._lock:
            return any(nbytes <= len(b) <= 2 * nbytes for b in self._free)

    def _held(self) -> int:
        return self.in_flight + sum(len(b) for b in self._free)

    def take(self, state: Buffer | Sequence[Buffer], background: bool = False) -> Snapshot | None:
        """Snapshot `state` (the workload's chunks), or None when the bound would be passed.

        Immutable `bytes` are kept as they are: nothing can change them, so holding them is a
        snapshot already. Anything else (a bytearray, an array's buffer) is copied. With
        `background` (and at least `background_from` bytes), the copy is made by a thread and
        this returns at once: the caller must not let the workload change `state` (step, load,
        close) before `wait()` returns. A yielded workload, parked in the warm cache, does not
        change, and the GPU it leaves can serve the next job meanwhile."""
        chunks = [state] if isinstance(state, Buffer) else list(state)
        views = [memoryview(c) for c in chunks]
        nbytes = sum(v.nbytes for v in views)
        with self._lock:
            if self.in_flight + nbytes > self.max_bytes:
                return None
            self.in_flight += nbytes
            self.peak = max(self.peak, self.in_flight)
        snapshot = Snapshot([], nbytes)
        if background and nbytes >= self.background_from:
            threading.Thread(
                target=self._copy, args=(snapshot, chunks, views), name="clockq-snapshot", daemon=True
            ).start()
            return snapshot
        self._copy(snapshot, chunks, views)
        if snapshot.error is not None:
            self.release(snapshot)
            raise snapshot.error
        return snapshot

    def _copy(self, snapshot: Snapshot, chunks: list[Buffer], views: list[memoryview]) -> None:
        try:
            for view, chunk in zip(views, chunks, strict=True):
                if isinstance(chunk, bytes):
                    snapshot.chunks.append(chunk)
                    continue
                flat = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
                buffer = self._buffer(flat.nbytes)
                snapshot._buffers.append(buffer)
                target = memoryview(buffer)[: flat.nbytes]
                # numpy's copy releases the GIL (a memoryview assignment holds it for the whole
                # copy): the worker's main thread goes on with the next job meanwhile.
                np.copyto(np.frombuffer(target, dtype=np.uint8), np.frombuffer(flat, dtype=np.uint8))
                snapshot.chunks.append(target)
        except BaseException as exc:
            snapshot.error = exc
        finally:
            snapshot._copied.set()

    def release(self, snapshot: Snapshot) -> None:
        snapshot.wait_copied()  # a copy still being made into its buffers finishes first
        with self._lock:
            self.in_flight -= snapshot.nbytes
            held = self.in_flight + sum(len(b) for b in self._free)
            for buffer in snapshot._buffers:
                if held + len(buffer) <= self.max_bytes:  # keep it for the next snapshot
                    self._free.append(buffer)
                    held += len(buffer)
        snapshot.chunks, snapshot._buffers = [], []

    def _buffer(self, n: int) -> Pooled:
        """A free buffer of at least n bytes (and not over twice that), or a new one. Free
        buffers are dropped as needed, so that what is held never passes the bound."""
        with self._lock:
            fits = [b for b in self._free if n <= len(b) <= 2 * n]
            if fits:
                best = min(fits, key=len)
                self._free.remove(best)
                return best
            self._free.sort(key=len)
            while self._free and self.in_flight + sum(len(b) for b in self._free) > self.max_bytes:
                self._free.pop()
        return _allocate(n)


def _allocate(n: int) -> Pooled:
    if n >= POPULATE_FROM_BYTES and hasattr(mmap, "MAP_POPULATE"):
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE
        return mmap.mmap(-1, n, flags=flags)
    return bytearray(n)


@dataclass
class Persist:
    job_id: int
    name: str
    snapshot: Snapshot
    keep: tuple[str, ...]  # what the database names once this is written; older files go


Failed = Callable[[Persist, StorageError], None]


class Marks:
    """This worker's marks of its persists in flight, in the broker's Redis. Every failure is
    logged and swallowed: a mark that could not be set makes the caller write at once, and one
    that could not be cleared or refreshed expires by itself."""

    def __init__(self, client: Callable[[], redis.Redis], writer: str):
        self.client = client
        self.writer = writer

    def set(self, job_id: int, name: str) -> bool:
        try:
            persists.mark(self.client(), job_id, name, self.writer)
        except RedisError as exc:
            log.warning("job %s: cannot mark %s as being written (%s); writing it now", job_id, name, exc)
            return False
        return True

    def clear(self, job_id: int, name: str) -> None:
        try:
            persists.unmark(self.client(), job_id, name)
        except RedisError as exc:
            log.info("job %s: cannot clear the mark of %s (%s); it expires by itself", job_id, name, exc)

    def refresh(self, marks: Iterable[tuple[int, str]]) -> None:
        try:
            persists.refresh(self.client(), marks)
        except RedisError as exc:
            log.warning("cannot refresh the marks of persists in flight: %s", exc)


class Persister:
    """One background thread per worker process that writes snapshots, in the order taken.

    A job's snapshot that is still queued when a newer one of the same job arrives is dropped:
    the newer one holds all its work, and writing both would only let the disk fall further
    behind when a job is preempted again and again (a burst of RT jobs)."""

    def __init__(
        self,
        store: CheckpointStore,
        memory: SnapshotMemory,
        on_failure: Failed,
        on_written: Callable[[], None],
        marks: Marks | None = None,
    ):
        self.store = store
        self.memory = memory
        self.on_failure = on_failure
        self.on_written = on_written
        self.marks = marks  # None: no other worker will look (unit tests)
        self._queue: deque[Persist] = deque()
        self._writing: Persist | None = None
        self._failed_jobs: set[int] = set()
        self.superseded = 0
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._switch_done = threading.Event()
        self._switch_done.set()

    def mark(self, job_id: int, name: str) -> bool:
        """Say, before the database names it, that this worker will write `name`. False when it
        cannot be said: the caller then writes the checkpoint itself, before handing over."""
        return self.marks is None or self.marks.set(job_id, name)

    def unmark(self, job_id: int, name: str) -> None:
        """A marked checkpoint that will not be submitted after all (its update failed)."""
        if self.marks is not None:
            self.marks.clear(job_id, name)

    def pause(self) -> None:
        """A switch is under way: hold writes back until the next job's first step (`resume`),
        SWITCH_QUIET_S at most. Written at once, a checkpoint's fsync would hold up the switch's
        own database commits on the same disk, and its checksum and copy would take CPU from the
        claim."""
        self._switch_done.clear()

    def resume(self) -> None:
        self._switch_done.set()

    def submit(self, persist: Persist) -> None:
        """Write it in the background. Call only after the database names it."""
        with self._changed:
            dropped = [p for p in self._queue if p.job_id == persist.job_id]
            for old in dropped:
                self._queue.remove(old)
            self.superseded += len(dropped)
            self._queue.append(persist)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="clockq-persist", daemon=True)
                self._thread.start()
                if self.marks is not None:
                    threading.Thread(target=self._keep_marks, name="clockq-persist-marks", daemon=True).start()
            self._changed.notify_all()
        for old in dropped:
            log.info("job %s: %s superseded by %s before it was written", old.job_id, old.name, persist.name)
            self.memory.release(old.snapshot)
            self.unmark(old.job_id, old.name)

    def pending(self, job_id: int, name: str) -> bytes | None:
        """The state of a checkpoint this worker has yet to write, if it has one: a job that
        comes back before its persist is done restores from memory."""
        with self._changed:
            found = next((p.snapshot for p in self._in_flight() if (p.job_id, p.name) == (job_id, name)), None)
        if found is None:
            return None
        try:
            found.wait()  # its copy, outside the lock
        except StorageError:
            return None  # its copy failed; so will its write, and the restore falls back
        with self._changed:
            # Still in flight, so not released (see _run). Gone: written meanwhile; read the file.
            if any(p.snapshot is found for p in self._in_flight()):
                return b"".join(found.chunks)
        return None

    def settle(self, job_id: int) -> None:
        """Until this job's snapshots are copied, so that its workload may change again (step,
        load, close): see SnapshotMemory.take's `background`."""
        with self._changed:
            snapshots = [p.snapshot for p in self._in_flight() if p.job_id == job_id]
        for snapshot in snapshots:
            snapshot.wait_copied()

    def unwritten(self, job_id: int) -> set[str]:
        """The job's checkpoints that this worker has named but not written (yet, or ever: a
        superseded one is never written)."""
        with self._changed:
            return {p.name for p in self._in_flight() if p.job_id == job_id}

    def take_failure(self, job_id: int) -> bool:
        """Whether a persist of this job failed since the last call."""
        with self._changed:
            failed = job_id in self._failed_jobs
            self._failed_jobs.discard(job_id)
            return failed

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every persist is written (a stopping worker). False on timeout."""
        self.resume()
        with self._changed:
            return self._changed.wait_for(lambda: not self._queue and self._writing is None, timeout)

    def in_flight(self) -> int:
        with self._changed:
            return len(self._in_flight())

    def _in_flight(self) -> list[Persist]:
        return [*([self._writing] if self._writing else []), *self._queue]

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._queue))
                persist = self._writing = self._queue.popleft()
            try:
                self._switch_done.wait(SWITCH_QUIET_S)
                persist.snapshot.wait()
                self.store.write(persist.job_id, persist.name, persist.snapshot.chunks)
                self.store.prune(persist.job_id, persist.keep)
                self.on_written()
            except Exception as exc:
                # A storage fault, or a bug; either way the generation is lost, and the job
                # resumes from the one before it. Persisting goes on for every other job.
                error = exc if isinstance(exc, StorageError) else StorageError(repr(exc))
                log.warning("job %s: persisting %s failed: %s", persist.job_id, persist.name, error)
                with self._changed:
                    self._failed_jobs.add(persist.job_id)
                try:
                    self.on_failure(persist, error)
                except Exception:
                    log.exception("job %s: reporting a failed persist failed", persist.job_id)
            finally:
                self.unmark(persist.job_id, persist.name)  # after the rename: a claim looks again
                with self._changed:
                    # Out of flight and released in one step: `pending` reads a snapshot under
                    # this lock only while it is in flight, so never one being given back.
                    self._writing = None
                    self.memory.release(persist.snapshot)
                    self._changed.notify_all()

    def _keep_marks(self) -> None:
        """Refresh the marks while their writes last: a big write outlasts the marks' TTL, and
        only a worker that stopped (died, frozen) should let them expire."""
        assert self.marks is not None
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._in_flight()))
                marked = [(p.job_id, p.name) for p in self._in_flight()]
            self.marks.refresh(marked)
            time.sleep(persists.REFRESH_S)
