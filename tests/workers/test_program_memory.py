"""A command program is held to a memory limit that CUDA can live with: real programs allocate,
and real workers (or the worker's own code, in process) kill them with a reason that names it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from clockq.jobs import workloads
from clockq.jobs.checkpoints import CheckpointStore
from tests.harness import ROOT, needs_sandbox, processes_of, program_python, wait_for
from tests.helpers import submit, wait_finished
from workers import memory_bound, sandbox
from workers.memory_bound import MemoryLimitExceeded, share_per_gpu_mb
from workers.memory_cgroup import CgroupUnavailable, find_parent
from workers.workloads import command
from workers.workloads.base import JobRefused, RunContext
from workers.workloads.command import CommandWorkload

PY = program_python()
# Touches `argv[1]` MB (b"x" * n writes every page), then holds it until killed (or 10 minutes).
HOG = "import sys, time\nheld = b'x' * (int(sys.argv[1]) << 20)\nopen('touched', 'w')\ntime.sleep(600)"
MODEST = "import sys\nheld = b'x' * (int(sys.argv[1]) << 20)\nopen('touched', 'w')"


def cgroup_problem() -> str:
    try:
        find_parent("auto")
    except CgroupUnavailable as exc:
        return str(exc)
    return ""


needs_cgroup = pytest.mark.skipif(bool(cgroup_problem()), reason=cgroup_problem() or "-")
ENFORCEMENTS = [pytest.param("cgroup", marks=needs_cgroup), "watchdog"]


def start(argv: list[str], job_id: int = 7) -> CommandWorkload:
    params = workloads.validate("command", {"argv": argv, "step_ms": 5.0}, may_run_commands=True)
    workload = CommandWorkload(params)
    workload.setup(RunContext(job_id, 0, CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR).work_dir(job_id)))
    return workload


def run_to_end(workload: CommandWorkload) -> CommandWorkload:
    """Step the program to its end, as a worker does (a program killed for its memory raises)."""
    try:
        wait_for(lambda: workload.step() >= 1.0, 60, interval=0, what="the program's end")
    finally:
        workload.close()
    return workload


@pytest.fixture
def small_limit(settings, monkeypatch):
    settings.CLOCKQ_COMMAND_MEMORY_MB = 64
    monkeypatch.setattr(command, "HANDLER_WAIT_S", 0.05)  # these programs install no SIGUSR1 handler
    return settings


# --- with real worker processes -----------------------------------------------------------


@needs_sandbox()
@pytest.mark.integration
@pytest.mark.parametrize("enforce", ENFORCEMENTS)
def test_a_program_that_touches_more_than_its_limit_fails_its_job_naming_the_limit_and_the_worker_runs_the_next(
    start_workers, operator, enforce
):
    # Given a worker whose programs may use 64 MB, held by a cgroup or by the watchdog,
    workers = start_workers(gpus=1, CLOCKQ_COMMAND_MEMORY_MB="64", CLOCKQ_COMMAND_MEMORY_ENFORCE=enforce)
    before = workers.worker_pids()

    # when oscar's program touches 512 MB and holds it,
    hog = submit(operator, "SP", "hog", workload="command", argv=[PY, "-c", HOG, "512"])
    (hog,) = wait_finished(hog, timeout=90)

    # then it is killed and its job fails with the limit named, at once,
    assert hog.state == "failed"
    assert "the program used more than its memory limit of 64 MB (CLOCKQ_COMMAND_MEMORY_MB)" in hog.last_error
    assert "; killed" in hog.last_error
    # and the same worker runs his next program, which stays within it.
    modest = submit(operator, "SP", "modest", workload="command", argv=[PY, "-c", MODEST, "16"])
    (modest,) = wait_finished(modest, timeout=90)
    assert modest.state == "succeeded", modest.last_error
    assert workers.worker_pids() == before
    if enforce == "cgroup":  # each program's cgroup went with it (the workers' cgroup is this test's)
        box = sandbox.sandbox_for_commands()
        assert not any((box.memory.cgroup.path / f"clockq-uid{box.uid_for(job.pk)}").exists() for job in (hog, modest))


# --- a program run by the worker's code, in this process ----------------------------------


@needs_sandbox()
@needs_cgroup
def test_the_program_is_in_a_cgroup_of_its_own_from_its_start_and_the_cgroup_goes_with_it(small_limit):
    parent = find_parent("auto").path
    # cat's first read: nothing of the program ran before it.
    workload = run_to_end(start(["/bin/cat", "/proc/self/cgroup"]))

    memory_line = next(
        line for line in (workload.work_dir / "stdout.log").read_text().splitlines() if ":memory:" in line
    )
    # The sandbox's cgroup namespace is rooted at the worker's cgroup: the program is in a child.
    assert memory_line.endswith(f":/clockq-uid{workload.folder.owner}")
    assert not (parent / f"clockq-uid{workload.folder.owner}").exists()


@needs_sandbox()
def test_a_program_may_reserve_far_more_address_space_than_its_memory_limit_as_cuda_does(small_limit):
    # 64 GiB of address space, no access (prot 0), no memory: what CUDA's runtime does at its start.
    reserve = (
        "import mmap\nm = mmap.mmap(-1, 64 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=0)\n"
        "open('reserved', 'w')"
    )
    workload = run_to_end(start([PY, "-c", reserve]))
    assert (workload.work_dir / "reserved").exists()


@needs_sandbox()
@pytest.mark.parametrize("enforce", ENFORCEMENTS)
def test_files_in_the_programs_private_tmp_count_toward_its_memory(small_limit, enforce):
    small_limit.CLOCKQ_COMMAND_MEMORY_ENFORCE = enforce
    # 256 MB of files, written 1 MB at a time: the program's own memory stays small.
    fill_tmp = (
        "import time\nwith open('/tmp/big', 'wb') as f:\n    for _ in range(256):\n        f.write(b'x' * (1 << 20))\n"
        "open('written', 'w')\ntime.sleep(600)"
    )
    workload = start([PY, "-c", fill_tmp])

    with pytest.raises(MemoryLimitExceeded, match=r"memory limit of 64 MB \(CLOCKQ_COMMAND_MEMORY_MB\)"):
        run_to_end(workload)
    assert processes_of(workload.folder.owner) == []


@pytest.mark.parametrize("enforce", ["auto", "watchdog"])
def test_a_program_without_a_sandbox_is_held_by_the_watchdog(small_limit, enforce):
    small_limit.CLOCKQ_COMMAND_SANDBOX = "none"
    small_limit.CLOCKQ_COMMAND_MEMORY_ENFORCE = enforce
    workload = start([PY, "-c", HOG, "256"])

    with pytest.raises(MemoryLimitExceeded, match=r"memory limit of 64 MB \(CLOCKQ_COMMAND_MEMORY_MB\): it held"):
        run_to_end(workload)
    assert "watchdog" in sandbox.sandbox_for_commands().describe()


@needs_sandbox()
def test_with_no_limit_nothing_is_watched_and_the_start_line_says_it_is_unsafe(settings):
    settings.CLOCKQ_COMMAND_MEMORY_MB = 0
    box = sandbox.sandbox_for_commands()
    assert box.memory.enforcement is memory_bound.Enforcement.NONE
    assert "memory unlimited (CLOCKQ_COMMAND_MEMORY_MB=0, unsafe)" in box.describe()


def test_a_cgroup_asked_for_where_none_can_be_made_refuses_command_jobs_with_the_reason(settings):
    settings.CLOCKQ_COMMAND_MEMORY_MB = 64
    settings.CLOCKQ_COMMAND_MEMORY_ENFORCE = "cgroup"
    settings.CLOCKQ_COMMAND_CGROUP = "/nonexistent/clockq"
    with pytest.raises(JobRefused, match="/nonexistent/clockq is not a cgroup v2 folder nor a v1 memory cgroup"):
        memory_bound.memory_policy(sandboxed=True)
    settings.CLOCKQ_COMMAND_MEMORY_ENFORCE = "auto"  # the watchdog instead, saying why
    policy = memory_bound.memory_policy(sandboxed=True)
    assert policy.enforcement is memory_bound.Enforcement.WATCHDOG and "/nonexistent/clockq" in policy.describe()


# --- the default limit --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total_mb", "gpus", "share_mb"),
    [
        (24_000, 1, 24_000 - 4096 - 2136),
        (24_000, 2, (24_000 - 4096 - 2 * 2136) // 2),
        (2_048_000, 8, (2_048_000 - 4096 - 8 * 2136) // 8),  # an 8-GPU node with 2 TB
        (8_000, 4, memory_bound.MIN_SHARE_MB),  # too small to share: the floor
    ],
)
def test_each_gpus_program_gets_an_even_share_of_what_the_host_does_not_keep(total_mb, gpus, share_mb):
    assert share_per_gpu_mb(total_mb, gpus, reserve_mb=4096, per_worker_mb=2136) == share_mb


def test_by_default_the_limit_is_the_hosts_share_per_gpu_and_the_reason_says_how_to_set_it(settings, monkeypatch):
    settings.CLOCKQ_COMMAND_MEMORY_MB = None
    settings.CLOCKQ_SNAPSHOT_MEMORY_MB, settings.CLOCKQ_WARM_CACHE_MB = 1024, 512
    monkeypatch.setattr(memory_bound, "host_memory_mb", lambda: 64_000)
    monkeypatch.setattr(memory_bound, "host_gpu_count", lambda: 2)
    limit_mb, source = memory_bound.configured_limit_mb()
    per_worker = memory_bound.WORKER_PROCESSES_MB + 1024 + 512
    assert limit_mb == (64_000 - settings.CLOCKQ_COMMAND_MEMORY_RESERVE_MB - 2 * per_worker) // 2
    assert source == "this host's share per GPU; CLOCKQ_COMMAND_MEMORY_MB sets it"


def test_the_hosts_memory_is_its_memtotal_or_its_containers_limit_when_lower():
    meminfo = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:"))
    assert 0 < memory_bound.host_memory_mb() <= int(meminfo.split()[1]) // 1024


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "None"),
        ({"CLOCKQ_COMMAND_MEMORY_MB": "0"}, "0"),
        ({"CLOCKQ_COMMAND_MEMORY_MB": "12288"}, "12288"),
        ({"CLOCKQ_COMMAND_MEMORY_MB": "lots"}, "CLOCKQ_COMMAND_MEMORY_MB='lots' is not an integer"),
        ({"CLOCKQ_COMMAND_MEMORY_ENFORCE": "rlimit"}, "CLOCKQ_COMMAND_MEMORY_ENFORCE='rlimit' is not one of"),
        ({"CLOCKQ_COMMAND_CGROUP": "clockq"}, "CLOCKQ_COMMAND_CGROUP='clockq' is neither auto nor an absolute path"),
        ({"CLOCKQ_COMMAND_MEMORY_WATCH_MS": "1"}, "CLOCKQ_COMMAND_MEMORY_WATCH_MS=1 is below the minimum 10"),
    ],
)
def test_the_memory_settings_come_from_the_environment_and_bad_values_stop_startup(env, expected):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CLOCKQ_COMMAND_")}
    code = "import django; django.setup(); from django.conf import settings; print(settings.CLOCKQ_COMMAND_MEMORY_MB)"
    env = {**clean, "DJANGO_SETTINGS_MODULE": "clockq.settings", **env}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert expected in (done.stdout if done.returncode == 0 else done.stderr)


@needs_sandbox()
@needs_cgroup
def test_a_cgroup_left_by_a_worker_killed_mid_program_is_replaced_not_refused(small_limit):
    parent = find_parent("auto").path
    uid = sandbox.sandbox_for_commands().uid_for(7)
    (parent / f"clockq-uid{uid}").mkdir()  # empty: its processes died with their worker

    workload = run_to_end(start([PY, "-c", MODEST, "8"]))

    assert (workload.work_dir / "touched").exists()
    assert not (parent / f"clockq-uid{uid}").exists()


@needs_sandbox()
@needs_cgroup
def test_a_worker_sweeps_the_empty_cgroups_of_programs_whose_worker_was_killed_but_not_a_running_ones(small_limit):
    parent = find_parent("auto").path
    box = sandbox.sandbox_for_commands()
    running = box.lease_uid(8)  # job 8's program runs now, on another worker
    try:
        for job_id in (7, 8):
            (parent / f"clockq-uid{box.uid_for(job_id)}").mkdir()

        sandbox.sweep_leftover_cgroups.__wrapped__(parent)

        assert not (parent / f"clockq-uid{box.uid_for(7)}").exists()
        assert (parent / f"clockq-uid{box.uid_for(8)}").exists()
    finally:
        running.release()
        (parent / f"clockq-uid{box.uid_for(8)}").rmdir()
