"""A job's program cannot take the checkpoint store from everyone else: the attacks that filled
it (stdout, many files, small files, a sparse result, a sparse checkpoint), each against a real
worker process, with the store on a real tmpfs of its own.

Each ends the same way: the job that passed a bound fails, with a reason that names it, and
the store, the worker and the next job are as before."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

from clockq.bus import heartbeat
from clockq.jobs.checkpoints import CheckpointStore
from clockq.jobs.models import Slice
from tests.harness import needs_sandbox, program_python
from tests.helpers import submit, wait_finished

pytestmark = [pytest.mark.integration, needs_sandbox()]

PY = program_python()
STORE_MB = 256
# The protocol (a checkpoint on SIGUSR1, exit 75; --resume ends it), then `body`, then it ends.
PROGRAM = r"""
import os, signal, sys
def checkpoint(*_):
{on_checkpoint}
    sys.exit(75)
signal.signal(signal.SIGUSR1, checkpoint)
if "--resume" in sys.argv:
    sys.exit(0)
{body}
"""
SAVE = '    open("checkpoint.tmp", "w").write("0"); os.replace("checkpoint.tmp", "checkpoint")'


def program(body: str, on_checkpoint: str = SAVE) -> list[str]:
    return [PY, "-c", PROGRAM.format(body=body.strip(), on_checkpoint=on_checkpoint)]


@pytest.fixture
def store(crossable_dir, settings):
    """The checkpoint store on a tmpfs of STORE_MB, crossable by programs' uids."""
    mount = crossable_dir / "store"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={STORE_MB}m,mode=0711", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()[:200]}")
    settings.CLOCKQ_CHECKPOINT_DIR = mount / "checkpoints"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def used_mb(mount: Path) -> float:
    vfs = os.statvfs(mount)
    return (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize / 2**20


def work_dir(job) -> Path:
    return CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR).job_dir(job.pk) / "work"


def assert_the_store_serves_the_next_job(owner, faults_before: int = 0) -> None:
    """Another job, with a checkpoint and a result, runs to success on the same worker, which is
    not degraded (any more), and no slice met a fault but those before."""
    after = submit(owner, "SP", "after", steps=20, step_ms=2, state_kb=64)
    (after,) = wait_finished(after, timeout=60)
    assert after.state == "succeeded" and after.result_files, after.last_error
    assert not heartbeat.degraded_workers()
    assert Slice.objects.filter(outcome="fault").count() == faults_before


def test_a_program_flooding_its_stdout_keeps_only_the_end_of_it_and_fills_nothing(start_workers, operator, store):
    start_workers(gpus=1, CLOCKQ_COMMAND_LOG_KEEP_KB="64")
    flood = program(
        'chunk = b"x" * (1 << 20) + b"\\n"\n'
        f"for _ in range({2 * STORE_MB}):\n    sys.stdout.buffer.write(chunk)\n"
        'sys.stdout.buffer.write(b"the end\\n")'
    )

    (job,) = wait_finished(submit(operator, "SP", "flood", workload="command", argv=flood, step_ms=10), timeout=120)

    # Twice the store went through the worker; what is kept is the end of it, 64 KB.
    assert job.state == "succeeded", job.last_error
    log = (work_dir(job) / "stdout.log").read_bytes()
    assert log.endswith(b"x\nthe end\n") and len(log) <= 64 * 1024
    assert used_mb(store) < 16
    assert_the_store_serves_the_next_job(operator)


def test_a_program_filling_its_work_folder_is_stopped_at_its_jobs_limit(start_workers, operator, store):
    start_workers(gpus=1, CLOCKQ_JOB_STORAGE_MB="8")
    fill = program('i = 0\nwhile True:\n    open(f"f{i}", "wb").write(b"y" * (1 << 20))\n    i += 1')

    (job,) = wait_finished(submit(operator, "SP", "fill", workload="command", argv=fill, step_ms=10), timeout=60)

    assert job.state == "failed"
    assert "the limit of 8 MB for one job (CLOCKQ_JOB_STORAGE_MB)" in job.last_error, job.last_error
    assert job.failures == 0  # failed at once: a retry would only pass the limit again
    # What it wrote is gone; what it holds now (its logs) is what its owner's quota counts.
    assert sorted(os.listdir(work_dir(job))) == ["stderr.log", "stdout.log"]
    assert job.work_files == 2 and job.work_bytes < 1024
    assert used_mb(store) < 16
    assert_the_store_serves_the_next_job(operator)


def test_a_program_making_small_files_is_stopped_at_its_jobs_file_limit(start_workers, operator, store):
    start_workers(gpus=1, CLOCKQ_JOB_FILES="500")
    files = program('i = 0\nwhile True:\n    open(f"e{i}", "w").close()\n    i += 1')

    (job,) = wait_finished(submit(operator, "SP", "inodes", workload="command", argv=files, step_ms=10), timeout=60)

    assert job.state == "failed"
    assert "the limit of 500 files for one job (CLOCKQ_JOB_FILES)" in job.last_error, job.last_error
    assert len(os.listdir(work_dir(job))) == 2
    assert_the_store_serves_the_next_job(operator)


def test_a_sparse_result_is_refused_by_its_apparent_size_before_it_is_copied(start_workers, operator, store):
    start_workers(gpus=1)
    sparse = program('os.mkdir("result")\nwith open("result/big.bin", "wb") as f:\n    f.truncate(3 << 30)')

    (job,) = wait_finished(submit(operator, "SP", "sparse", workload="command", argv=sparse, step_ms=10), timeout=60)

    assert job.state == "failed"
    assert "the result (3,221.2 MB, apparent size) is refused" in job.last_error, job.last_error
    assert "could ever hold" in job.last_error
    job_dir = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR).job_dir(job.pk)
    assert not [p.name for p in job_dir.iterdir() if p.name.startswith("result")]  # no staging folder left
    assert used_mb(store) < 16
    assert_the_store_serves_the_next_job(operator)


def test_a_sparse_checkpoint_is_refused_before_it_is_read_and_counted_against_the_job(start_workers, operator, store):
    workers = start_workers(gpus=1, CLOCKQ_CHECKPOINT_EVERY_S="1", CLOCKQ_MAX_RETRIES="1")
    # Its checkpoint, 3 GiB of holes: nothing on disk, but 3 GiB to read and to store.
    huge = (
        '    with open("checkpoint.tmp", "wb") as f:\n        f.truncate(3 << 30)\n'
        '    os.replace("checkpoint.tmp", "checkpoint")'
    )
    argv = program("import time\nwhile True:\n    time.sleep(0.01)", on_checkpoint=huge)

    (job,) = wait_finished(submit(operator, "SP", "huge", workload="command", argv=argv, step_ms=10), timeout=90)

    assert job.state == "failed"
    assert job.failures == 2  # the job's fault, counted: tried once more, then failed
    assert "checkpoint (3,221.2 MB, apparent size) cannot be stored" in job.last_error, job.last_error
    # Refused before it was read: the worker never held it in memory.
    for pid in workers.worker_pids():
        assert peak_rss_mb(pid) < 1024
    assert_the_store_serves_the_next_job(operator)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


def test_a_storage_fault_that_follows_a_job_is_the_jobs_after_three(start_workers, alice, store):
    # Checkpoints written at once (no snapshot memory), every second.
    start_workers(gpus=1, CLOCKQ_CHECKPOINT_EVERY_S="1", CLOCKQ_SNAPSHOT_MEMORY_MB="0")
    # A state larger than the whole store: every checkpoint of it fails, while the store takes
    # every other write.
    big = submit(alice, "SP", "big", steps=100_000, step_ms=5, state_kb=STORE_MB * 1200)

    (big,) = wait_finished(big, timeout=120)

    assert big.state == "failed" and big.failures == 0 and big.storage_faults == 3
    assert "the fault follows the job, so it is the job's" in big.last_error, big.last_error
    assert "CLOCKQ_JOB_STORAGE_FAULTS=3" in big.last_error
    assert big.slices.filter(outcome="fault").count() == 3
    assert_the_store_serves_the_next_job(alice, faults_before=3)
