from __future__ import annotations

import os

import pytest

from clockq.jobs.checkpoints import (
    MAGIC,
    CheckpointError,
    CheckpointMissing,
    CheckpointStore,
    RestoreAbandoned,
    StorageError,
    checkpoint_name,
)

CLAIM = "c" * 32
OTHER_CLAIM = "d" * 32


def gen(n: int, claim: str = CLAIM) -> str:
    return checkpoint_name(n, claim)


@pytest.fixture
def store(tmp_path):
    return CheckpointStore(tmp_path)


def test_a_written_checkpoint_reads_back_verified(store):
    store.write(7, gen(1), b"hello")
    assert store.read(7, gen(1)) == b"hello"


def test_chunks_are_written_as_one_payload(store):
    store.write(7, gen(1), [b"he", bytearray(b"ll"), memoryview(b"o!")])
    assert store.read(7, gen(1)) == b"hello!"


def test_prune_keeps_what_the_database_names_and_anything_newer(store):
    for n in range(1, 5):
        store.write(7, gen(n), bytes([n]) * 10)
    store.write(7, gen(5, OTHER_CLAIM), b"another claim's, newer")
    store.write(7, gen(5), b"five")

    store.prune(7, [gen(4), gen(2)])

    # 1 is older than anything named. 3 and the 5s are not older, so they are left: by the time a
    # background persist prunes, the job may have a new owner whose files these are.
    assert sorted(p.name for p in store.job_dir(7).glob("*.ckpt")) == [
        gen(2),
        gen(3),
        gen(4),
        gen(5),
        gen(5, OTHER_CLAIM),
    ]
    store.prune(7, [gen(5), gen(4)])
    assert sorted(p.name for p in store.job_dir(7).glob("*.ckpt")) == [gen(4), gen(5), gen(5, OTHER_CLAIM)]


def test_no_temporary_file_is_left_behind(store):
    store.write(7, gen(1), b"x" * 1000)
    assert [p.name for p in store.job_dir(7).iterdir() if p.is_file()] == [gen(1)]


@pytest.mark.parametrize("name", ["gen-1.ckpt", "../../etc/passwd", f"gen-00000001-{'X' * 32}.ckpt", ""])
def test_a_name_that_is_not_a_checkpoint_name_is_refused(store, name):
    with pytest.raises(ValueError, match="not a checkpoint name"):
        store.path(7, name)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: data[:-3], "truncated"),
        (lambda data: data[:-1] + bytes([data[-1] ^ 0xFF]), "checksum"),
        (lambda data: b"garbage" + data, "no clockq header"),
        (lambda data: MAGIC + b"{not json\n" + b"payload", "unreadable header"),
    ],
)
def test_a_damaged_checkpoint_is_rejected_with_a_reason(store, damage, message):
    store.write(7, gen(1), b"payload" * 100)
    path = store.path(7, gen(1))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CheckpointError, match=message):
        store.read(7, gen(1))


def test_a_file_renamed_to_another_claims_name_is_rejected(store):
    store.write(7, gen(2, OTHER_CLAIM), b"a stale worker's")
    store.path(7, gen(2, OTHER_CLAIM)).rename(store.path(7, gen(2)))
    with pytest.raises(CheckpointError, match="another claim"):
        store.read(7, gen(2))


def test_restore_falls_back_to_the_previous_name(store):
    store.write(7, gen(1), b"older")
    store.write(7, gen(2), b"newer")
    path = store.path(7, gen(2))
    path.write_bytes(path.read_bytes()[:-1] + b"X")

    restored = store.restore(7, [gen(2), gen(1)])

    assert (restored.generation, restored.state) == (1, b"older")
    assert "checksum" in restored.skipped[0]


def test_restore_reads_only_what_it_is_named(store):
    store.write(7, gen(1), b"named")
    store.write(7, gen(2, OTHER_CLAIM), b"written by a worker that lost the job")
    assert store.restore(7, [gen(1)]).state == b"named"


def _restore_while_written(store, write, **restore_kw):
    """Restore [gen 2, gen 1] of job 7 while `write` puts gen 2 in place: once the restore has
    looked for it and found it missing."""
    read = store.read

    def read_then_write(job_id, name):
        try:
            return read(job_id, name)
        except CheckpointMissing:
            if name == gen(2):
                write()
            raise

    store.read = read_then_write
    return store.restore(7, [gen(2), gen(1)], wait_s=30, **restore_kw)


def test_restore_waits_for_the_newest_while_it_is_being_written(store):
    store.write(7, gen(1), b"older")
    restored = _restore_while_written(store, lambda: store.write(7, gen(2), b"newer"))
    assert restored.state == b"newer" and restored.skipped == ()


def test_restore_falls_back_once_the_wait_is_over(store):
    store.write(7, gen(1), b"older")
    looked = []
    read = store.read
    store.read = lambda job_id, name: looked.append(name) or read(job_id, name)
    restored = store.restore(7, [gen(2), gen(1)], wait_s=0.3)
    assert looked.count(gen(2)) > 1  # it looked again while it waited
    assert restored.state == b"older"
    assert "missing after waiting 0.3 s" in restored.skipped[0]


def test_restore_waits_only_while_a_writer_is_at_it(store):
    store.write(7, gen(1), b"older")
    writing = {gen(2): "gpu0@elsewhere"}

    def write_then_unmark():
        store.write(7, gen(2), b"newer")
        writing.clear()  # the mark goes after the rename, as the persister does it

    restored = _restore_while_written(store, write_then_unmark, writer_of=writing.get)
    assert restored.state == b"newer" and restored.skipped == ()


def test_restore_falls_back_at_once_when_nobody_is_writing_the_newest(store):
    store.write(7, gen(1), b"older")
    asked = []
    restored = store.restore(7, [gen(2), gen(1)], wait_s=30, writer_of=lambda name: asked.append(name))
    assert asked == [gen(2)]  # once, not until the 30 s bound: its writer is gone
    assert restored.state == b"older"
    assert "no worker is writing it any more" in restored.skipped[0]


def test_restore_stops_waiting_for_a_writer_that_never_finishes(store):
    store.write(7, gen(1), b"older")
    restored = store.restore(7, [gen(2), gen(1)], wait_s=0.3, writer_of=lambda name: "gpu3@stuck")
    assert restored.state == b"older"
    assert "after waiting 0.3 s for its writer gpu3@stuck" in restored.skipped[0]


def test_a_restore_waiting_for_a_writer_is_abandoned_when_asked(store):
    # An RT job wants the GPU while the newest checkpoint is still being written elsewhere.
    store.write(7, gen(1), b"older")
    asked = []

    def abandon() -> bool:
        asked.append(1)
        return len(asked) >= 3

    with pytest.raises(RestoreAbandoned, match="gpu0@elsewhere was still writing"):
        store.restore(7, [gen(2), gen(1)], wait_s=30, writer_of=lambda name: "gpu0@elsewhere", abandon=abandon)
    assert len(asked) == 3
    # Never asked when there is nothing to wait for.
    assert store.restore(7, [gen(1)], wait_s=30, abandon=lambda: pytest.fail("asked")).state == b"older"


def test_restore_with_nothing_usable_starts_from_the_beginning(store):
    store.write(7, gen(1), b"only")
    store.path(7, gen(1)).unlink()
    assert store.restore(7, [gen(1)]).state is None
    assert store.restore(7, []).generation == 0


def test_a_file_from_another_job_is_rejected(store):
    store.write(8, gen(1), b"not yours")
    store.job_dir(7).mkdir(parents=True)
    store.path(7, gen(1)).write_bytes(store.path(8, gen(1)).read_bytes())
    with pytest.raises(CheckpointError, match="belongs to job 8"):
        store.read(7, gen(1))


def test_a_full_disk_is_a_storage_error_and_leaves_no_partial_file(tiny_filesystem):
    from tests.harness import fill

    store = CheckpointStore(tiny_filesystem / "ckpt")
    store.write(7, gen(1), b"first")
    fill(tiny_filesystem)
    with pytest.raises(StorageError, match="No space left"):
        store.write(7, gen(2), b"x" * 200_000)
    assert sorted(p.name for p in store.job_dir(7).iterdir()) == [gen(1)]
    assert store.read(7, gen(1)) == b"first"


def test_a_storage_that_cannot_be_read_is_not_a_reason_to_fall_back(store, monkeypatch):
    """An I/O error says nothing about the checkpoint: falling back to an older generation, or to
    the beginning, would throw work away for a fault of the disk."""
    import errno

    store.write(7, gen(1), b"one")
    store.write(7, gen(2), b"two")

    def eio(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr("clockq.jobs.checkpoints.open", eio, raising=False)
    with pytest.raises(StorageError, match="Input/output error"):
        store.restore(7, [gen(2), gen(1)])


def test_a_checkpoint_grown_sparse_past_its_header_is_refused_before_its_payload_is_read(store, monkeypatch):
    """Its header says how long it is; a file of another size (torn, or truncated up to 3 GiB,
    which takes no blocks) is refused by its size, so reading it costs no memory."""
    store.write(7, gen(1), b"x" * 1000)
    os.truncate(store.path(7, gen(1)), 3 * 2**30)
    reads = []
    real_open = open

    def counting_open(*args, **kwargs):
        fh = real_open(*args, **kwargs)
        real_read = fh.read

        def read(n=-1):
            reads.append(n)
            return real_read(n)

        fh.read = read
        return fh

    monkeypatch.setattr("clockq.jobs.checkpoints.open", counting_open, raising=False)
    with pytest.raises(CheckpointError, match="truncated"):
        store.read(7, gen(1))
    assert all(0 <= n <= 64 for n in reads), reads  # the magic only; never the payload


def test_checkpoints_named_before_claims_still_restore(store):
    """Files from before names carried the claim (gen-00000003.ckpt), as migration 0016 names them."""
    legacy = "gen-00000003.ckpt"
    store.write(7, legacy, b"from an older clockq")
    assert store.restore(7, [legacy]).state == b"from an older clockq"
