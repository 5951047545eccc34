"""The result store: atomic, checked, hashed; links and odd names refused."""

from __future__ import annotations

import hashlib
import os

import pytest

from clockq.jobs.results import ResultError, ResultStore


def stage(store, job_id=7, **files):
    staged = store.staging(job_id)
    for name, data in files.items():
        (staged / name).write_bytes(data)
    return staged


def test_a_result_is_stored_in_one_piece_with_its_checksums(tmp_path):
    store = ResultStore(tmp_path)
    manifest = store.store(7, stage(store, a=b"alpha", b=b"beta" * 1000))
    assert [(f.name, f.bytes) for f in manifest.files] == [("a", 5), ("b", 4000)]
    assert manifest.file("b").sha256 == hashlib.sha256(b"beta" * 1000).hexdigest()
    assert store.manifest(7) == manifest
    with store.open(7, "a") as fh:
        assert fh.read() == b"alpha"
    assert sorted(p.name for p in (tmp_path / "7").iterdir()) == ["result"]  # no staging left


def test_a_second_store_replaces_the_first_whole(tmp_path):
    store = ResultStore(tmp_path)
    store.store(7, stage(store, old=b"1"))
    store.store(7, stage(store, new=b"2"))
    assert [f.name for f in store.manifest(7).files] == ["new"]
    assert not (store.folder(7) / "old").exists()


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda d: os.symlink("/etc/passwd", d / "passwd"), "not a regular file"),
        (lambda d: (d / "sub").mkdir(), "not a regular file"),
        (lambda d: (d / ".hidden").write_bytes(b"x"), "not allowed"),
        (lambda d: (d / "manifest.json").write_bytes(b"{}"), "not allowed"),
        (lambda d: (d / "with space").write_bytes(b"x"), "not allowed"),
        (lambda d: [(d / f"f{i}").write_bytes(b"x") for i in range(101)], "at most 100 files"),
    ],
)
def test_a_bad_result_is_refused_and_nothing_is_stored(tmp_path, make, error):
    store = ResultStore(tmp_path)
    staged = store.staging(7)
    make(staged)
    with pytest.raises(ResultError, match=error):
        store.store(7, staged)
    assert store.manifest(7) is None


def test_only_listed_plain_names_open(tmp_path):
    store = ResultStore(tmp_path)
    store.store(7, stage(store, a=b"x"))
    for name in ("../7/result/a", "manifest.json", ""):
        with pytest.raises(FileNotFoundError):
            store.open(7, name)


def test_a_command_programs_result_folder_never_hands_over_a_linked_file(tmp_path):
    """The program owns CLOCKQ_RESULT_DIR; a link there (or the folder itself a link) fails the
    job instead of copying a file the worker can read and the job's owner should not."""
    from workers.job_folder import JobFolder
    from workers.workloads.command import CommandWorkload
    from workers.workloads.command_storage import ProgramStorage

    work = tmp_path / "work"
    (work / "result").mkdir(parents=True)
    (work / "result" / "ok.txt").write_bytes(b"fine")
    workload = CommandWorkload({"argv": ["true"]})
    workload.folder = JobFolder(work, None)
    # Set up as setup() would outside a claim: the per-job storage caps alone.
    workload.work_dir, workload.storage = work, ProgramStorage(None, workload.folder, work)
    out = tmp_path / "out"
    out.mkdir()
    workload.write_result(out)
    assert (out / "ok.txt").read_bytes() == b"fine"

    os.symlink("/etc/passwd", work / "result" / "stolen")
    with pytest.raises(ResultError, match="stolen"):
        (tmp_path / "out2").mkdir()
        workload.write_result(tmp_path / "out2")
    os.unlink(work / "result" / "stolen")

    # A hard link is a regular file too, but a second name of someone else's.
    (tmp_path / "private").write_bytes(b"not the job's")
    os.link(tmp_path / "private", work / "result" / "linked")
    with pytest.raises(ResultError, match="linked"):
        (tmp_path / "out4").mkdir()
        workload.write_result(tmp_path / "out4")
    os.unlink(work / "result" / "linked")

    (work / "result").rename(work / "elsewhere")
    os.symlink("/etc", work / "result")
    with pytest.raises(ResultError, match="not a folder"):
        (tmp_path / "out3").mkdir()
        workload.write_result(tmp_path / "out3")
