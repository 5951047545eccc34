"""Snapshot, then persist: the memory bound, flushing, settling, and a failed write."""

from __future__ import annotations

import threading

import pytest

from clockq.jobs.checkpoints import CheckpointStore, StorageError, checkpoint_name
from tests.harness import WatchedEvent, wait_for
from workers.persister import Persist, Persister, SnapshotMemory

MB = 2**20
CLAIM = "e" * 32


class GatedStore(CheckpointStore):
    """A real store whose writes wait for the test to open a gate: a slow disk, on demand."""

    def __init__(self, root):
        super().__init__(root)
        self.gate = threading.Event()
        self.writing = threading.Event()  # a write has started (and waits at the gate)
        self.fail_with: Exception | None = None

    def write(self, job_id, name, state):
        self.writing.set()
        assert self.gate.wait(10), "the test never opened the gate"
        if self.fail_with is not None:
            raise self.fail_with
        return super().write(job_id, name, state)


@pytest.fixture
def store(tmp_path):
    return GatedStore(tmp_path)


def _persister(store, memory, failures=None):
    failures = [] if failures is None else failures
    return Persister(store, memory, on_failure=lambda p, e: failures.append((p.name, str(e))), on_written=list)


def test_a_snapshot_copies_live_buffers_and_keeps_immutable_bytes():
    memory = SnapshotMemory(10 * MB)
    live, frozen = bytearray(b"a" * 1000), b"b" * 1000
    snapshot = memory.take([frozen, live])
    live[:] = b"c" * 1000  # the next step changes the live state

    assert snapshot.join() == b"b" * 1000 + b"a" * 1000
    assert snapshot.chunks[0] is frozen
    assert memory.in_flight == 2000


def test_the_snapshot_memory_bound_holds_and_buffers_are_reused():
    memory = SnapshotMemory(3 * MB)
    state = bytearray(MB)
    first, second, third = (memory.take(state) for _ in range(3))
    assert memory.take(state) is None  # a fourth would pass the bound: the caller writes it itself
    assert memory.in_flight == 3 * MB

    buffer = first._buffers[0]
    memory.release(first)
    fourth = memory.take(state)
    assert fourth is not None and memory.peak == 3 * MB
    assert fourth._buffers[0] is buffer  # a released snapshot's buffer is used again...
    for snapshot in (second, third, fourth):
        memory.release(snapshot)
    assert memory.in_flight == 0
    # ...and what the pool keeps never passes the bound either
    assert sum(len(b) for b in memory._free) <= 3 * MB


def test_a_reserved_buffer_is_ready_for_the_first_snapshot_and_within_the_bound():
    memory = SnapshotMemory(40 * MB)
    assert memory.reserve(16 * MB)
    (ready,) = memory._free
    assert len(ready) == 16 * MB
    assert memory.reserve(16 * MB) and len(memory._free) == 1  # one is ready already
    assert not memory.reserve(32 * MB)  # 16 + 32 would pass the bound of 40

    snapshot = memory.take([b"head", bytearray(b"x" * (16 * MB))])
    assert snapshot._buffers == [ready]  # copied into the reserved buffer, not a new one
    assert snapshot.join() == b"head" + b"x" * (16 * MB)
    memory.release(snapshot)
    assert memory.in_flight == 0 and memory._free == [ready]


def test_a_state_larger_than_the_bound_is_never_snapshotted():
    assert SnapshotMemory(MB).take(bytearray(MB + 1)) is None
    assert SnapshotMemory(0).take(b"x") is None


def test_persists_hold_at_most_the_bound_while_the_disk_is_slow(store):
    """The runner's rule: take a snapshot if the bound allows, else write synchronously."""
    memory = SnapshotMemory(2 * MB)
    persister = _persister(store, memory)
    written_now = 0
    for gen in range(1, 6):
        snapshot = memory.take(bytearray(MB))
        if snapshot is None:
            written_now += 1  # the runner writes this one before handing the GPU over
            continue
        name = checkpoint_name(gen, CLAIM)
        persister.submit(Persist(7, name, snapshot, (name,)))
        # The first is being written, not queued, before the next comes: a queued one of the
        # same job would be superseded, and its memory given back.
        assert store.writing.wait(5)
        assert memory.in_flight <= 2 * MB
    assert written_now == 3 and persister.in_flight() == 2

    store.gate.set()
    assert persister.flush(timeout=10)
    assert memory.in_flight == 0 and persister.in_flight() == 0


def test_a_pending_checkpoint_is_restored_from_memory_and_flush_writes_it(store):
    memory = SnapshotMemory(10 * MB)
    persister = _persister(store, memory)
    name = checkpoint_name(1, CLAIM)
    persister.submit(Persist(7, name, memory.take([b"head", bytearray(b"state")]), (name,)))

    assert persister.pending(7, name) == b"headstate"
    assert not persister.flush(timeout=0.2)  # the disk is still busy

    store.gate.set()
    assert persister.flush(timeout=10)
    assert persister.pending(7, name) is None
    assert store.read(7, name) == b"headstate"


def test_a_failed_persist_is_reported_once(store):
    memory = SnapshotMemory(10 * MB)
    failures: list = []
    persister = _persister(store, memory, failures)
    store.fail_with = StorageError("No space left on device")
    name = checkpoint_name(1, CLAIM)
    persister.submit(Persist(7, name, memory.take(bytearray(10)), (name,)))
    store.gate.set()
    assert persister.flush(timeout=10)

    assert persister.take_failure(7) is True  # the runner writes the next one at once
    assert persister.take_failure(7) is False  # said once
    assert failures == [(name, "No space left on device")]
    assert memory.in_flight == 0


def test_a_queued_snapshot_is_superseded_by_the_jobs_newer_one(store):
    memory = SnapshotMemory(10 * MB)
    persister = _persister(store, memory)
    first, second, third = (checkpoint_name(gen, CLAIM) for gen in (1, 2, 3))
    persister.submit(Persist(7, first, memory.take(bytearray(b"1")), (first,)))
    wait_for(lambda: persister._writing is not None, 5, what="the first write to start")
    persister.submit(Persist(7, second, memory.take(bytearray(b"2")), (second, first)))
    persister.submit(Persist(8, second, memory.take(bytearray(b"other job")), (second,)))
    assert persister.unwritten(7) == {first, second}

    persister.submit(Persist(7, third, memory.take(bytearray(b"3")), (third, second, first)))

    # The second was still queued: the third holds all its work, so it is never written. The
    # first was being written already, and is; so is the other job's.
    assert persister.superseded == 1 and persister.unwritten(7) == {first, third}
    store.gate.set()
    assert persister.flush(timeout=10)
    assert store.read(7, first) == b"1" and store.read(7, third) == b"3" and store.read(8, second) == b"other job"
    assert not store.path(7, second).exists()
    assert memory.in_flight == 0


def test_prune_after_a_persist_keeps_the_named_generations(store):
    memory = SnapshotMemory(10 * MB)
    persister = _persister(store, memory)
    store.gate.set()
    names = [checkpoint_name(gen, CLAIM) for gen in (1, 2, 3)]
    for i, name in enumerate(names):
        keep = tuple(reversed(names[max(i - 1, 0) : i + 1]))
        persister.submit(Persist(7, name, memory.take(bytearray(b"s")), keep))
        assert persister.flush(timeout=10)
    assert sorted(p.name for p in store.job_dir(7).glob("*.ckpt")) == names[1:]


def test_a_persist_in_flight_is_marked_in_redis_until_written(store, monkeypatch):
    """The mark a claim elsewhere reads (clockq/bus/persists.py), on the session's real Redis:
    set before the persist is submitted, refreshed past its TTL while the disk is slow, and
    cleared once the file is there."""
    from clockq.bus import persists
    from clockq.bus.client import client
    from workers.persister import Marks

    monkeypatch.setattr(persists, "TTL_S", 1)
    monkeypatch.setattr(persists, "REFRESH_S", 0.2)
    memory = SnapshotMemory(MB)
    persister = Persister(store, memory, on_failure=print, on_written=list, marks=Marks(client, "gpu0@here"))
    name = checkpoint_name(3, CLAIM)
    assert persister.mark(7, name)
    first_expiry = redis_now(client()) + persists.TTL_S  # the mark was set before: it expires sooner
    persister.submit(Persist(7, name, memory.take(bytearray(10)), (name,)))
    # Redis's own clock past the first mark's expiry: only the refreshing keeps the mark.
    wait_for(lambda: redis_now(client()) > first_expiry, 10, what="the first mark's TTL to run out")
    assert persists.writer_of(client(), 7, name) == "gpu0@here"
    store.gate.set()
    assert persister.flush(timeout=10)
    assert store.path(7, name).exists()
    assert persists.writer_of(client(), 7, name) is None


def redis_now(r) -> float:
    """The Redis server's clock, by which its keys expire."""
    seconds, micros = r.time()
    return seconds + micros / 1e6


def test_a_marked_checkpoint_that_is_never_submitted_is_unmarked():
    from clockq.bus import persists
    from clockq.bus.client import client
    from workers.persister import Marks

    marks = Marks(client, "gpu0@here")
    name = checkpoint_name(4, CLAIM)
    assert marks.set(8, name)
    assert persists.writer_of(client(), 8, name) == "gpu0@here"
    marks.clear(8, name)
    assert persists.writer_of(client(), 8, name) is None


class GatedCopies(SnapshotMemory):
    """Real snapshot memory whose background copies wait for the test: a slow copy, on demand."""

    def __init__(self, max_bytes):
        super().__init__(max_bytes, background_from=0)  # even the tests' small states
        self.gate = threading.Event()

    def _copy(self, snapshot, chunks, views):
        if threading.current_thread().name == "clockq-snapshot":
            assert self.gate.wait(10), "the test never opened the gate"
        super()._copy(snapshot, chunks, views)


def test_a_parked_workloads_snapshot_is_copied_in_the_background_and_settled_before_it_changes(store):
    memory = GatedCopies(10 * MB)
    persister = _persister(store, memory)
    live = bytearray(b"a" * 1000)
    snapshot = memory.take([b"head", live], background=True)
    assert not snapshot._copied.is_set()  # the GPU's thread did not wait for the copy, held at the gate
    copied = snapshot._copied = WatchedEvent()  # the copy sets it once made
    name = checkpoint_name(5, CLAIM)
    persister.submit(Persist(7, name, snapshot, (name,)))

    settled = threading.Event()
    threading.Thread(target=lambda: (persister.settle(7), settled.set()), daemon=True).start()
    assert copied.waited.wait(10)  # settle waits for the copy ...
    assert not settled.is_set()  # ... so the workload may not change yet
    memory.gate.set()
    assert settled.wait(10)
    live[:] = b"b" * 1000  # the job runs again: its next step changes the live state

    store.gate.set()
    assert persister.flush(timeout=10)
    assert store.read(7, name) == b"head" + b"a" * 1000  # the state it was parked with
    assert memory.in_flight == 0


def test_a_background_copy_is_finished_before_its_memory_is_given_back():
    memory = GatedCopies(10 * MB)
    snapshot = memory.take([bytearray(b"x" * 100)], background=True)
    snapshot._copied = WatchedEvent(on_wait=memory.gate.set)  # the copy goes ahead once it is waited for
    memory.release(snapshot)  # a discarded snapshot: waits for its copy, then frees the buffer
    assert memory.gate.is_set() and memory.in_flight == 0


def test_writes_wait_while_a_switch_is_under_way_and_no_longer_than_the_cap(tmp_path, monkeypatch):
    memory = SnapshotMemory(10 * MB)
    persister = _persister(CheckpointStore(tmp_path), memory)
    name = checkpoint_name(1, CLAIM)
    monkeypatch.setattr("workers.persister.SWITCH_QUIET_S", 60.0)
    switch_done = persister._switch_done = WatchedEvent()
    switch_done.set()

    persister.pause()  # a job yielded; the next one has not started yet
    persister.submit(Persist(7, name, memory.take([b"state"]), (name,)))
    assert switch_done.waited.wait(10)  # the writer took it, and waits for the switch
    assert persister.pending(7, name) == b"state"  # held back
    persister.resume()  # the next job's first step
    wait_for(lambda: persister.pending(7, name) is None, 10)
    assert not switch_done.timed_out.is_set()  # written for the resume, not for the cap

    # No next job: the write goes ahead after SWITCH_QUIET_S anyway.
    monkeypatch.setattr("workers.persister.SWITCH_QUIET_S", 0.05)
    later = checkpoint_name(2, CLAIM)
    persister.pause()
    persister.submit(Persist(7, later, memory.take([b"later"]), (later, name)))
    wait_for(lambda: persister.pending(7, later) is None, 10)
    assert switch_done.timed_out.is_set() and not switch_done.is_set()  # the cap ran out mid-switch
    assert CheckpointStore(tmp_path).read(7, later) == b"later"


def test_a_small_snapshot_is_copied_at_once_even_for_a_parked_workload():
    memory = SnapshotMemory(10 * MB, background_from=MB)
    live = bytearray(b"a" * 1000)
    snapshot = memory.take([live], background=True)
    live[:] = b"b" * 1000  # nothing waits on a copy: it was made before take() returned
    assert snapshot.join() == b"a" * 1000
