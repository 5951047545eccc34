"""A job's program attacks the worker, as an attacker with the `run command` permission did.

Each test is one attack, written as the attacker wrote it, against real sandboxes (bubblewrap)
and, where the attack needs them, real worker processes. They skip only where this machine
cannot make the namespaces a sandbox needs, or where the tests are not root (a program gets a
uid of its own only under a root worker).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from django.conf import settings

from clockq.bus.client import client
from clockq.jobs import services, workloads
from clockq.jobs.checkpoints import CheckpointStore
from clockq.jobs.models import Job
from tests.harness import is_alive, needs_sandbox, processes_of, program_python, wait_for
from tests.helpers import submit, wait_finished
from workers import sandbox
from workers.workloads import command
from workers.workloads.base import RunContext
from workers.workloads.command import CommandWorkload

pytestmark = needs_sandbox()

PY = program_python()
# A program that checkpoints on SIGUSR1 (the protocol), runs until told, and does `attack`
# first: at its start, or (`in_handler`) in its SIGUSR1 handler just before it yields.
PROGRAM = r"""
import os, signal, sys, time
def attack():
{attack}
def checkpoint(*_):
    if {in_handler}:
        attack()
    open("checkpoint.new", "w").write("saved")
    os.replace("checkpoint.new", "checkpoint")
    sys.exit(75)
signal.signal(signal.SIGUSR1, checkpoint)
if "--resume" in sys.argv:
    print("resumed", flush=True)
    sys.exit(0)
if not {in_handler}:
    attack()
open("started", "w").write("1")
while True:
    time.sleep(0.01)
"""


def program(attack: str, *, in_handler: bool = False) -> list[str]:
    body = "\n".join("    " + line for line in attack.strip().splitlines())
    return [PY, "-c", PROGRAM.format(attack=body, in_handler=in_handler)]


def start(job_id: int, argv: list[str]) -> CommandWorkload:
    params = workloads.validate("command", {"argv": argv, "step_ms": 5.0}, may_run_commands=True)
    workload = CommandWorkload(params)
    workload.setup(RunContext(job_id, 0, CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR).work_dir(job_id)))
    return workload


def run_until(workload: CommandWorkload, name: str) -> None:
    """Step the program until it has made `name` in its work folder."""
    wait_for(lambda: workload.step() is not None and (workload.work_dir / name).exists(), 20, interval=0, what=name)


@pytest.fixture
def root_only(crossable_dir):
    """A file only root may read or write, such as var/redis/redis.conf."""
    path = crossable_dir / "redis.conf"
    path.write_text("requirepass broker-s3cret\n")
    path.chmod(0o600)
    return path


def test_a_link_put_in_place_of_stderr_does_not_bring_the_file_it_points_to_into_the_error(root_only):
    link = (
        "import os, sys\nos.path.lexists('stderr.log') and os.unlink('stderr.log')\n"
        f"os.symlink({str(root_only)!r}, 'stderr.log')\n"
    )
    workload = start(7, [PY, "-c", link + "sys.stderr.write('it broke\\n')\nsys.exit(1)"])

    with pytest.raises(RuntimeError) as failure:
        while workload.step() < 1.0:
            pass
    workload.close()

    assert "exited with code 1" in str(failure.value) and "it broke" in str(failure.value)
    assert "broker-s3cret" not in str(failure.value)
    assert root_only.read_text() == "requirepass broker-s3cret\n" and root_only.stat().st_uid == 0


def test_a_link_put_in_place_of_stdout_is_not_appended_to_at_the_next_start(root_only):
    workload = start(
        7,
        program(
            f"os.path.lexists('stdout.log') and os.unlink('stdout.log'); os.symlink({str(root_only)!r}, 'stdout.log')"
        ),
    )
    run_until(workload, "started")

    assert workload.state_dict() == b"saved"  # SIGUSR1, exit 75
    while workload.step() < 1.0:  # started again, with --resume: it prints and exits 0
        pass
    workload.close()

    assert root_only.read_text() == "requirepass broker-s3cret\n"
    log = workload.work_dir / "stdout.log"
    assert not log.is_symlink() and log.read_text() == "resumed\n"  # a new log in the link's place


def test_a_link_planted_at_the_checkpoints_temporary_name_is_not_written_through_on_a_cold_restore(root_only):
    # Given a program that plants the link in its SIGUSR1 handler and yields,
    first = start(7, program(f"os.symlink({str(root_only)!r}, 'checkpoint.clockq-tmp')", in_handler=True))
    run_until(first, "started")
    state = first.state_dict()
    first.close()
    assert os.path.islink(first.work_dir / "checkpoint.clockq-tmp")

    # when the job resumes on another GPU's worker, which writes the checkpoint back,
    second = start(7, program("pass"))
    second.load_state_dict(state)

    # then root's file is neither overwritten nor given away, and the checkpoint is the job's.
    assert root_only.read_text() == "requirepass broker-s3cret\n"
    assert (root_only.stat().st_uid, root_only.stat().st_mode & 0o777) == (0, 0o600)
    checkpoint = second.work_dir / "checkpoint"
    assert checkpoint.read_bytes() == b"saved" and checkpoint.stat().st_uid == second.folder.owner != 0
    while second.step() < 1.0:
        pass
    second.close()


def test_a_setsid_grandchild_does_not_outlive_its_programs_success(monkeypatch):
    monkeypatch.setattr(command, "HANDLER_WAIT_S", 0.05)
    workload = start(
        7, [PY, "-c", "import subprocess\nsubprocess.Popen(['setsid', 'sleep', '300'])\nopen('started', 'w')"]
    )
    uid = workload.folder.owner
    wait_for(lambda: workload.step() == 1.0, 20, interval=0, what="the program's success")

    assert processes_of(uid) == []  # gone by the time the step reports success
    workload.close()


def test_two_programs_running_at_once_have_different_uids_and_cannot_see_each_others_folders(monkeypatch):
    monkeypatch.setattr(command, "HANDLER_WAIT_S", 0.05)  # these programs install no SIGUSR1 handler
    store = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR)
    peek = r"""
import json, os, sys, time
open("private.txt", "w").write("mine")
open("started", "w").write("1")
while not os.path.exists("go"):
    time.sleep(0.01)
other = sys.argv[1]
def attempt(action):
    try:
        action()
        return "allowed"
    except OSError as exc:
        return exc.strerror
report = {"uid": os.getuid(), "read": attempt(lambda: open(other + "/private.txt").read()),
          "list": attempt(lambda: os.listdir(other)), "signal": attempt(lambda: os.kill(int(sys.argv[2]), 0))}
open("report.json", "w").write(json.dumps(report))
"""
    alice = start(7, [PY, "-c", peek, str(store.work_dir(8)), "0"])
    run_until(alice, "started")
    bob = start(8, [PY, "-c", peek, str(store.work_dir(7)), str(alice.program_pid)])
    run_until(bob, "started")

    for workload in (alice, bob):
        (workload.work_dir / "go").write_text("")
    for workload in (alice, bob):
        wait_for(lambda w=workload: w.step() == 1.0, 20, interval=0, what="the report")
        workload.close()

    alice_saw = json.loads((alice.work_dir / "report.json").read_text())
    bob_saw = json.loads((bob.work_dir / "report.json").read_text())
    assert alice_saw["uid"] != bob_saw["uid"]
    assert {alice_saw["uid"], bob_saw["uid"]} == {alice.folder.owner, bob.folder.owner}
    for saw in (alice_saw, bob_saw):
        assert saw["read"] == saw["list"] == "No such file or directory"
    assert bob_saw["signal"] == "No such process"  # alice's program is not in bob's PID namespace


# --- with real worker processes -----------------------------------------------------------

# A program whose grandchild, in a session of its own, keeps looking for other jobs' files.
LINGERER = r"""
import signal, subprocess, sys, time
signal.signal(signal.SIGUSR1, lambda *_: (open("checkpoint", "w").write("x"), sys.exit(75)))
SEARCH = "import glob, sys, time\nwhile True:\n    for path in glob.glob(sys.argv[1] + '/*/work/private.txt'):\n" \
    "        try:\n            open('stolen', 'a').write(open(path).read())\n        except OSError:\n" \
    "            pass\n    time.sleep(0.01)\n"
subprocess.Popen(["setsid", sys.executable, "-c", SEARCH, sys.argv[1]], start_new_session=True)
open("started", "w").write("1")
for _ in range(int(sys.argv[2])):
    time.sleep(0.01)
"""


def lingerer(loops: int) -> list[str]:
    return [PY, "-c", LINGERER, str(settings.CLOCKQ_CHECKPOINT_DIR), str(loops)]


def running_program(job: Job) -> tuple[Path, set[int]]:
    """The job's work folder and its processes, once its program and grandchild are up."""
    work = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR).work_dir(job.pk)
    uid = sandbox.sandbox_for_commands().uid_for(job.pk)
    # bwrap's two processes, the program and its grandchild
    wait_for(lambda: (work / "started").exists() and len(processes_of(uid)) >= 4, 60, what="the program to be up")
    return work, set(processes_of(uid))


def wait_gone(pids: set[int]) -> None:
    wait_for(lambda: not any(is_alive(pid) for pid in pids), 30, what=f"processes {sorted(pids)} to be gone")


@pytest.mark.integration
def test_a_leftover_of_a_finished_job_cannot_read_a_later_jobs_folder(start_workers, operator):
    start_workers(gpus=1)
    attacker = submit(operator, "SP", "lingers", workload="command", argv=lingerer(50))
    work, pids = running_program(attacker)
    (attacker,) = wait_finished(attacker, timeout=60)
    assert attacker.state == "succeeded", attacker.last_error
    wait_gone(pids)  # its grandchild died with it

    victim = submit(
        operator, "SP", "victim", workload="command", argv=[PY, "-c", "open('private.txt', 'w').write('bob')"]
    )
    (victim,) = wait_finished(victim, timeout=60)

    assert victim.state == "succeeded", victim.last_error
    assert (CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR).work_dir(victim.pk) / "private.txt").read_text() == "bob"
    assert not (work / "stolen").exists()


@pytest.mark.integration
def test_a_cancelled_job_leaves_no_process(start_workers, operator):
    start_workers(gpus=1)
    job = submit(operator, "SP", "cancel me", workload="command", argv=lingerer(100_000))
    _, pids = running_program(job)

    services.cancel_job(Job.objects.get(pk=job.pk), actor="test")

    wait_gone(pids)
    assert Job.objects.get(pk=job.pk).state == "cancelled"


@pytest.mark.integration
def test_a_worker_killed_with_kill_9_leaves_no_process_of_its_job(start_workers, operator):
    start_workers(gpus=1)
    job = submit(operator, "SP", "orphan", workload="command", argv=lingerer(100_000))
    _, pids = running_program(job)
    worker = json.loads(client().get(f"clockq:worker:{Job.objects.get(pk=job.pk).worker}"))["pid"]
    # slirp4netns, the program's network, runs as its uid and must go too (its --exit-fd closes);
    # where this machine cannot make that network, the suite's programs have none (conftest.py).
    if settings.CLOCKQ_COMMAND_NETWORK == "private":
        assert "slirp4netns" in {Path(f"/proc/{pid}/comm").read_text().strip() for pid in pids}

    os.kill(worker, signal.SIGKILL)

    wait_gone(pids)
