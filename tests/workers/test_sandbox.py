"""A job's own program runs with none of clockq's rights. Each test is a real program trying."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from clockq.jobs import workloads
from clockq.jobs.checkpoints import CheckpointStore, checkpoint_name
from tests.harness import needs_sandbox, program_python
from workers import sandbox
from workers.runtime import Runtime, WorkerIdentity
from workers.slice_runner import RunOutcome, run_dispatch
from workers.workloads.base import JobRefused, RunContext
from workers.workloads.command import CommandWorkload

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="a program gets a uid of its own only under a root worker")

PROBE = r"""
import json, os, sys
def attempt(action):
    try:
        action()
        return "allowed"
    except PermissionError:
        return "denied"
    except OSError as exc:
        return f"error: {exc.strerror}"
protocol = ("CLOCKQ_CHECKPOINT_FILE", "CLOCKQ_PROGRESS_FILE", "CLOCKQ_JOB_ID", "CLOCKQ_WORK_DIR", "CLOCKQ_RESUME",
            "CLOCKQ_RESULT_DIR", "CLOCKQ_METRICS_FILE")
report = {"uid": os.getuid(), "env": sorted(k for k in os.environ if k in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")
          or k.startswith(("CELERY", "DJANGO_", "FLOWER_")) or (k.startswith("CLOCKQ_") and k not in protocol))}
for name, path in json.loads(sys.argv[1]).items():
    report["read " + name] = attempt(lambda: open(path, "rb").read(1))
report["write other job"] = attempt(lambda: open(sys.argv[2], "wb").write(b"x"))
report["write own work folder"] = attempt(lambda: open("mine", "wb").write(b"x"))
open("report.json", "w").write(json.dumps(report))
"""


def test_the_program_inherits_nothing_of_clockqs_settings():
    from workers.workloads.program_start import program_environment

    worker = {
        "PATH": "/usr/bin",
        "CUDA_VISIBLE_DEVICES": "3",
        "REDIS_URL": "redis://:pw@10.0.0.5:6390/0",
        "DATABASE_URL": "postgres://clockq:pw@db/clockq",
        "SECRET_KEY": "s",
        "CLOCKQ_EMBEDDED_REDIS_PORT": "6390",
        "CLOCKQ_ADMIN_PASSWORD": "a",
        "CELERY_BROKER_URL": "redis://x",
        "DJANGO_SETTINGS_MODULE": "clockq.settings",
        "FLOWER_BASIC_AUTH": "admin:a",
        "PORT": "8000",
    }
    assert program_environment(worker) == {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "3"}


def run_program(argv: list[str], job_id: int = 7) -> CommandWorkload:
    """Run `argv` as job `job_id`'s program to its end, the way a worker does."""
    params = workloads.validate("command", {"argv": argv, "step_ms": 5.0}, may_run_commands=True)
    workload = CommandWorkload(params)
    work = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR).work_dir(job_id)
    workload.setup(RunContext(job_id=job_id, gpu_index=0, work_dir=work))
    try:
        while workload.step() < 1.0:
            pass
    finally:
        workload.close()
    return workload


@needs_sandbox()
@pytest.mark.django_db
def test_the_program_runs_as_a_uid_of_its_own_and_cannot_reach_clockqs_secrets_or_other_jobs(alice):
    store = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR)
    store.write(8, checkpoint_name(1, "b" * 32), b"another job's state")  # another job, with a checkpoint of its own
    targets = {
        "secret key": str(settings.VAR_DIR / "secret_key"),
        "broker password": str(settings.EMBEDDED_REDIS_PASSWORD_FILE),
        "other job's checkpoint": str(store.path(8, checkpoint_name(1, "b" * 32))),
    }
    if connection.vendor == "sqlite":
        targets["database"] = connection.settings_dict["NAME"]
    for path in targets.values():
        assert os.path.exists(path), path
    other_job_file = str(store.job_dir(8) / "planted")

    workload = run_program([program_python(), "-c", PROBE, json.dumps(targets), other_job_file])

    report = json.loads((workload.work_dir / "report.json").read_text())
    assert report["uid"] == settings.CLOCKQ_COMMAND_UID_BASE + 7
    assert report["env"] == []
    # The sandbox does not show them at all; were it to, their modes would deny them.
    reads = {k: v for k, v in report.items() if k.startswith("read ")}
    assert reads == {f"read {name}": "error: No such file or directory" for name in targets}
    assert report["write other job"] == "error: No such file or directory"
    assert report["write own work folder"] == "allowed"


@as_root
def test_an_output_file_over_the_limit_stops_the_program(settings):
    settings.CLOCKQ_COMMAND_MAX_FILE_MB = 1
    code = "open('big', 'wb').write(b'x' * 3 * 2**20)"
    with pytest.raises(RuntimeError, match="File too large"):  # Python turns SIGXFSZ into EFBIG
        run_program([program_python(), "-c", code])


@as_root
def test_open_files_are_limited(settings):
    settings.CLOCKQ_COMMAND_MAX_FILES = 64
    code = (
        "files = []\ntry:\n    while True: files.append(open('/dev/null'))\n"
        "except OSError:\n    count = len(files)\n    [f.close() for f in files]\n"
        "    open('opened', 'w').write(str(count))"
    )
    workload = run_program([program_python(), "-c", code])
    assert int((workload.work_dir / "opened").read_text()) < 64


def test_a_worker_that_cannot_switch_users_refuses_commands_unless_allowed(settings, monkeypatch):
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    settings.CLOCKQ_ALLOW_SAME_USER_COMMANDS = False
    with pytest.raises(JobRefused, match="does not run as root"):
        sandbox.sandbox_for_commands()
    settings.CLOCKQ_ALLOW_SAME_USER_COMMANDS = True
    same_user = sandbox.sandbox_for_commands()
    assert same_user.uids is None and same_user.uid_for(7) is None and "user" not in same_user.popen_kwargs(None)


@pytest.mark.django_db(transaction=True)
def test_a_refused_command_job_fails_at_once_with_the_reason(operator, settings, monkeypatch):
    from tests.helpers import submit

    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    settings.CLOCKQ_ALLOW_SAME_USER_COMMANDS = False
    job = submit(operator, "SP", "script", workload="command", argv=["/bin/true"])

    assert run_dispatch(job.pk, job.dispatch_token, Runtime(WorkerIdentity("gpu0@test", 0))) == RunOutcome.FAILED

    job.refresh_from_db()
    assert job.state == "failed" and job.failures == 0 and "does not run as root" in job.last_error


@as_root
def test_programs_never_run_as_root_nor_as_uids_this_worker_cannot_map(settings, monkeypatch):
    settings.CLOCKQ_COMMAND_UID_BASE = 0
    with pytest.raises(JobRefused, match="must be above 0"):
        sandbox.sandbox_for_commands()
    # A container that maps only 65,536 uids.
    real_read = sandbox.Path.read_text
    monkeypatch.setattr(
        sandbox.Path,
        "read_text",
        lambda self: "0 100000 65536\n" if str(self) == "/proc/self/uid_map" else real_read(self),
    )
    settings.CLOCKQ_COMMAND_UID_BASE = 1_000_000_000
    with pytest.raises(JobRefused, match="not all mapped"):
        sandbox.sandbox_for_commands()
    settings.CLOCKQ_COMMAND_UID_BASE, settings.CLOCKQ_COMMAND_UID_COUNT = 20_000, 40_000
    assert sandbox.sandbox_for_commands().uid_for(7) == 20_007


def test_without_bubblewrap_commands_are_refused_unless_the_operator_says_unsafe(settings, monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(JobRefused, match="apt-get install bubblewrap"):
        sandbox.sandbox_for_commands()
    settings.CLOCKQ_COMMAND_SANDBOX = "none"
    unsafe = sandbox.sandbox_for_commands()
    assert unsafe.bwrap is None and unsafe.argv(["true"], work_dir=Path("/w"), info_fd=None) == ["true"]
    assert "WARNING" in unsafe.describe()


@as_root
def test_a_work_folder_outside_the_checkpoint_store_is_refused_and_left_alone(tmp_path):
    elsewhere = tmp_path / "job" / "work"
    elsewhere.mkdir(parents=True)
    before = (tmp_path.stat().st_mode, (tmp_path / "job").stat().st_mode)
    with pytest.raises(JobRefused, match="not a job's work folder"):
        sandbox.prepare_work_dir(elsewhere, settings.CLOCKQ_CHECKPOINT_DIR, sandbox.sandbox_for_commands().uid_for(7))
    assert (tmp_path.stat().st_mode, (tmp_path / "job").stat().st_mode) == before


@needs_sandbox()
def test_processes_are_limited(settings):
    settings.CLOCKQ_COMMAND_MAX_PROCESSES = 16
    code = (
        "import subprocess\nstarted = []\ntry:\n"
        "    for _ in range(64): started.append(subprocess.Popen(['sleep', '30']))\n"
        "except OSError:\n    pass\nopen('started', 'w').write(str(len(started)))"
    )
    workload = run_program([program_python(), "-c", code])
    assert 0 < int((workload.work_dir / "started").read_text()) < 16


@as_root
def test_a_uid_is_held_by_one_running_program_at_a_time_and_its_lock_file_goes_with_it(settings):
    settings.CLOCKQ_COMMAND_UID_BASE, settings.CLOCKQ_COMMAND_UID_COUNT = 2_000_000, 10
    box = sandbox.sandbox_for_commands()
    first = box.lease_uid(3)
    second = box.lease_uid(13)  # maps to the same uid as job 3, which holds it: the next one
    assert (first.uid, second.uid) == (2_000_003, 2_000_004)
    first.release()
    again = box.lease_uid(13)
    assert again.uid == 2_000_003
    for lease in (second, again):
        lease.release()
    assert not (sandbox.UID_LOCK_DIR / "2000003").exists() and not (sandbox.UID_LOCK_DIR / "2000004").exists()


@needs_sandbox()
@pytest.mark.django_db
def test_a_job_whose_uid_is_taken_runs_as_another_and_its_folder_is_given_to_that_one(settings):
    settings.CLOCKQ_COMMAND_UID_BASE, settings.CLOCKQ_COMMAND_UID_COUNT = 2_000_000, 10
    held = sandbox.sandbox_for_commands().lease_uid(3)  # job 3's program runs now
    try:
        store = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR)
        (store.work_dir(13) / "earlier").mkdir()  # left by job 13's earlier runs, as its usual uid
        os.chown(store.work_dir(13) / "earlier", 2_000_003, 2_000_003)

        workload = run_program(
            [program_python(), "-c", "import os; open('uid', 'w').write(str(os.getuid()))"], job_id=13
        )

        assert (workload.work_dir / "uid").read_text() == "2000004"
        assert {p.stat().st_uid for p in [workload.work_dir, *workload.work_dir.iterdir()]} == {2_000_004}
    finally:
        held.release()
