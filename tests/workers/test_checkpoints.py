from __future__ import annotations

import pytest

from workers.checkpoints import MAGIC, CheckpointError, CheckpointStore, StorageError


@pytest.fixture
def store(tmp_path):
    return CheckpointStore(tmp_path)


def test_a_written_generation_reads_back_verified(store):
    store.write(7, 1, b"hello")
    assert store.read(7, 1) == b"hello"


def test_only_the_last_two_generations_are_kept(store):
    for gen in range(1, 5):
        store.write(7, gen, bytes([gen]) * 10)
    assert sorted(p.name for p in store.job_dir(7).glob("*.ckpt")) == ["gen-00000003.ckpt", "gen-00000004.ckpt"]


def test_no_temporary_file_is_left_behind(store):
    store.write(7, 1, b"x" * 1000)
    assert [p.name for p in store.job_dir(7).iterdir() if p.is_file()] == ["gen-00000001.ckpt"]


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
    store.write(7, 1, b"payload" * 100)
    path = store.path(7, 1)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CheckpointError, match=message):
        store.read(7, 1)


def test_restore_falls_back_to_the_previous_generation(store):
    store.write(7, 1, b"older")
    store.write(7, 2, b"newer")
    path = store.path(7, 2)
    path.write_bytes(path.read_bytes()[:-1] + b"X")

    restored = store.restore(7, 2)

    assert (restored.generation, restored.state) == (1, b"older")
    assert "checksum" in restored.skipped[0]


def test_restore_with_nothing_usable_starts_from_the_beginning(store):
    store.write(7, 1, b"only")
    store.path(7, 1).unlink()
    assert store.restore(7, 1).state is None
    assert store.restore(7, 0).generation == 0


def test_a_file_from_another_job_is_rejected(store):
    store.write(8, 1, b"not yours")
    store.job_dir(7).mkdir(parents=True)
    store.path(7, 1).write_bytes(store.path(8, 1).read_bytes())
    with pytest.raises(CheckpointError, match="belongs to job 8"):
        store.read(7, 1)


def test_a_full_disk_is_a_storage_error_and_leaves_no_partial_file(tiny_filesystem):
    from tests.harness import fill

    store = CheckpointStore(tiny_filesystem / "ckpt")
    store.write(7, 1, b"first")
    fill(tiny_filesystem)
    with pytest.raises(StorageError, match="No space left"):
        store.write(7, 2, b"x" * 200_000)
    assert sorted(p.name for p in store.job_dir(7).iterdir()) == ["gen-00000001.ckpt"]
    assert store.read(7, 1) == b"first"


def test_a_storage_that_cannot_be_read_is_not_a_reason_to_fall_back(store, monkeypatch):
    """An I/O error says nothing about the checkpoint: falling back to an older generation, or to
    the beginning, would throw work away for a fault of the disk."""
    import errno
    from pathlib import Path

    store.write(7, 1, b"one")
    store.write(7, 2, b"two")

    def eio(self):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(Path, "read_bytes", eio)
    with pytest.raises(StorageError, match="Input/output error"):
        store.restore(7, 2)
