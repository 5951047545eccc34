"""A `command` job whose program cannot start fails at once, with the reason, and is not retried;
a fault of the host while starting it is never the job's (workers/workloads/program_start.py)."""

from __future__ import annotations

import errno

import pytest

from clockq.jobs.checkpoints import StorageError
from tests.harness import needs_sandbox
from tests.helpers import submit
from workers.runtime import Runtime, WorkerIdentity
from workers.slice_runner import RunOutcome, run_dispatch
from workers.workloads.program_start import ProgramCannotStart, exec_failure, start_error


def run_once(job) -> RunOutcome:
    return run_dispatch(job.pk, job.dispatch_token, Runtime(WorkerIdentity("gpu0@test", 0)))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("argv0", "reason"),
    [
        ("", "the program's name (argv[0]) is empty"),
        ("no-such-program-for-clockq", "'no-such-program-for-clockq' is not found on PATH"),
        ("/nonexistent/train.sh", "'/nonexistent/train.sh': no such file"),
        ("{plain}", "'{plain}' is not executable"),
        ("/usr", "'/usr' is a folder, not a program"),
    ],
)
def test_a_program_that_cannot_start_fails_the_job_at_once_with_the_reason(operator, crossable_dir, argv0, reason):
    # Given a command job whose program cannot start
    plain = crossable_dir / "notes.txt"  # a file the sandbox shows, without an execute bit
    plain.write_text("not a program\n")
    plain.chmod(0o644)
    argv0, reason = argv0.format(plain=plain), reason.format(plain=plain)
    job = submit(operator, "SP", "broken", workload="command", argv=[argv0, "--epochs", "3"])
    # When a worker takes it
    assert run_once(job) == RunOutcome.FAILED
    # Then it failed at once, not counted as a retry, with the reason in its last error
    job.refresh_from_db()
    assert job.state == "failed" and job.failures == 0 and job.finished_at is not None
    assert job.last_error.startswith(f"could not start the program {argv0!r}: {reason}")
    assert job.slices.count() == 1
    assert job.events.filter(to_state="queued").count() == 1  # its submission: never requeued


@needs_sandbox()
@pytest.mark.django_db(transaction=True)
def test_a_program_the_sandbox_cannot_see_fails_at_once_from_bwraps_report(operator, tmp_path, settings):
    # Given an executable this worker sees, in a folder the sandbox does not show its program
    settings.CLOCKQ_COMMAND_SANDBOX = "bwrap"
    program = tmp_path / "train.sh"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    job = submit(operator, "SP", "hidden", workload="command", argv=[str(program)])
    # When a worker takes it, bwrap cannot execute it
    assert run_once(job) == RunOutcome.FAILED
    job.refresh_from_db()
    assert job.state == "failed" and job.failures == 0
    assert job.last_error.startswith(f"could not start the program {str(program)!r}: ")


@pytest.mark.parametrize(
    ("err", "sandboxed", "kind"),
    [
        (errno.ENOENT, False, ProgramCannotStart),  # the program's file
        (errno.EACCES, False, ProgramCannotStart),
        (errno.ENOEXEC, False, ProgramCannotStart),
        (errno.ENOENT, True, RuntimeError),  # bwrap itself is missing: the host's, retried
        (errno.EAGAIN, False, RuntimeError),  # no process to spare: retried
        (errno.ENOMEM, True, RuntimeError),
        (errno.ENOSPC, False, StorageError),  # the work folder's disk: back to the queue, uncharged
        (errno.EIO, True, StorageError),
    ],
)
def test_only_the_programs_own_errors_are_final(err, sandboxed, kind):
    made = start_error(OSError(err, "x"), "train", sandboxed=sandboxed)
    assert type(made) is kind


@pytest.mark.parametrize(
    ("code", "stderr", "sandboxed", "final"),
    [
        (1, "bwrap: execvp train: No such file or directory\n", True, True),
        (1, "bwrap: Can't mount proc on /newroot/proc: Operation not permitted\n", True, False),  # the host's
        (1, "Traceback: the program's own error\n", True, False),
        (2, "bwrap: execvp train: No such file or directory\n", True, False),
        (1, "bwrap: execvp train: No such file or directory\n", False, False),
    ],
)
def test_bwraps_report_that_it_could_not_execute_the_program_is_final(code, stderr, sandboxed, final):
    made = exec_failure(code, stderr, "train", sandboxed=sandboxed)
    assert (made is not None) is final
    if final:
        assert str(made).startswith("could not start the program 'train': No such file or directory")
