"""Snapshot-then-persist under faults, with real worker processes: a worker killed with a persist
in flight, a worker frozen until its job has a new owner, a worker stopped with SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
from django.conf import settings

from clockq.jobs.checkpoints import CheckpointStore, generation_of
from clockq.jobs.models import Job
from control.reaper import reap_expired_leases
from control.reconcile import reconcile_queued_jobs
from tests.harness import ZOMBIE, process_stat, wait_for
from tests.helpers import assert_no_overlap, submit, wait_finished

pytestmark = pytest.mark.integration

MB_KB = 1024


def _store() -> CheckpointStore:
    return CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR)


def _claim_of(name: str) -> str:
    return name.rsplit("-", 1)[1].split(".")[0]


def _process_group_of(hostname: str) -> int:
    import json

    from clockq.bus.client import client

    return os.getpgid(json.loads(client().get(f"clockq:worker:{hostname}"))["pid"])


def _live_members(groups: set[int]) -> list[int]:
    """The processes of these process groups that are not dead yet (a zombie is dead)."""
    members = []
    for pid in (int(entry) for entry in os.listdir("/proc") if entry.isdigit()):
        fields = process_stat(pid)  # state, parent, process group, ...
        if fields is not None and fields[0] not in ZOMBIE and int(fields[2]) in groups:
            members.append(pid)
    return members


def _kill_and_wait(groups: set[int]) -> None:
    """SIGKILL the groups and wait until every process in them is dead. A killed thread that was
    inside a syscall (a rename) finishes it first, so a file looked at before then may still
    appear."""
    for group in groups:
        os.killpg(group, signal.SIGKILL)
    wait_for(lambda: not _live_members(groups), 10, interval=0.005, what="the killed workers to be dead")


def _threads_running(groups: set[int]) -> list[str]:
    """The threads of these groups' live processes that are not stopped yet. A thread inside a
    syscall (a write, an fsync, a rename) stops only once the syscall returns."""
    running = []
    for pid in _live_members(groups):
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError):
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("T", "t", *ZOMBIE):
                    running.append(f"{pid}/{task.name}:{state}")
    return running


def _freeze(groups: set[int]) -> None:
    """SIGSTOP the groups and wait until every thread in them has stopped: from then on nothing
    they do changes the disk, so what is on it can be judged before choosing to kill them."""
    for group in groups:
        os.killpg(group, signal.SIGSTOP)
    wait_for(lambda: not _threads_running(groups), 30, interval=0.002, what="the workers' threads to stop")


def _thaw(groups: set[int]) -> None:
    for group in groups:
        os.killpg(group, signal.SIGCONT)


@pytest.mark.slow  # about 25 s of jobs run to their end around a kill -9 (CI's slow pass runs it)
def test_a_worker_killed_with_a_persist_in_flight_loses_only_what_was_in_flight(start_workers, alice):
    # Two jobs take turns on one GPU with big states, so a persist is in flight most of the time.
    # The default wait bound (30 s): the claim must see for itself that nobody writes the file.
    workers = start_workers(gpus=1, CLOCKQ_OVERHEAD_BUDGET="0", CLOCKQ_LEASE_S="2")
    jobs = [submit(alice, "SP", f"big-{x}", steps=3000, step_ms=2, state_kb=96 * MB_KB) for x in "ab"]
    ids = [job.pk for job in jobs]
    store = _store()
    wait_for(
        lambda: Job.objects.filter(pk__in=ids, checkpoint_generation__gte=2).count() == 2, 60, what="two checkpoints"
    )

    def caught_in_flight():
        """A job whose newest named checkpoint is not on disk yet (its persist is in flight),
        with an older named one that is."""
        for job_id, files in Job.objects.filter(pk__in=ids).values_list("pk", "checkpoint_files"):
            on_disk = [name for name in files if store.path(job_id, name).exists()]
            if on_disk and files[0] not in on_disk:
                return job_id, files[0], on_disk[0]
        return None

    # Freeze the worker when a persist looks in flight, then look again: if the write is still
    # unfinished, kill the worker; if it finished in between, let the worker go on and look later.
    groups = {os.getpgid(pid) for pid in workers.worker_pids()}
    for _attempt in range(50):
        wait_for(caught_in_flight, 60, interval=0.002, what="a persist in flight")
        _freeze(groups)
        if caught_in_flight() is not None:
            break
        _thaw(groups)
    else:
        pytest.fail("never froze the worker in the middle of a persist")
    _kill_and_wait(groups)
    # Read again once the worker is dead: a database commit it had sent before it stopped may
    # have landed since (on PostgreSQL the server finishes it).
    victim = caught_in_flight()
    assert victim is not None, "the persist seen in flight while the worker was frozen finished"
    job_id, lost, durable = victim

    # The supervisor restarts the worker; the reaper takes back the job that was running. The
    # reconciler does what beat has it do every 15 s: a kill just after the worker took the
    # other job's wake-up off the list, before kombu recorded it as unacked, loses that message
    # (seen here: in neither the list nor the unacked hash), and only the reconciler sends it again.
    def finished():
        reap_expired_leases()
        reconcile_queued_jobs()
        return not Job.objects.filter(pk__in=ids, state__in=["queued", "running"]).exists()

    wait_for(finished, 180, interval=0.5, what="both jobs to finish")
    done = wait_finished(*jobs)

    assert all(job.state == "succeeded" for job in done)
    job = Job.objects.get(pk=job_id)
    # It lost what was in flight, and only that: it resumed from the newest generation on disk.
    history = list(job.events.order_by("at", "id").values_list("actor", "reason"))
    notes = [reason for _actor, reason in history if f"generation {generation_of(lost)} unusable" in reason]
    assert len(notes) == 1, (victim, history)
    note = notes[0]
    # It waited for the dead writer's mark to expire ("no worker is writing it"), not for the
    # whole 30 s bound (that note would say it is "missing after waiting").
    assert "no worker is writing it any more" in note and f"restored generation {generation_of(durable)}" in note
    assert "missing after waiting" not in note
    assert_no_overlap(job)
    assert not store.path(job_id, lost).exists()  # nobody wrote it later: its snapshot died with the worker


def test_a_frozen_worker_that_lost_its_job_cannot_touch_the_new_owners_checkpoint(start_workers, alice):
    # One job that checkpoints every 0.3 s while it runs; leases of 2 s.
    start_workers(gpus=2, CLOCKQ_LEASE_S="2", CLOCKQ_CHECKPOINT_EVERY_S="0.3")
    job = submit(alice, "SP", "fenced", steps=1500, step_ms=4, state_kb=256)
    wait_for(lambda: Job.objects.get(pk=job.pk).checkpoint_generation >= 2, 30, what="two checkpoints")
    old = Job.objects.get(pk=job.pk)
    old_claim = old.dispatch_token
    group = _process_group_of(old.worker)

    os.killpg(group, signal.SIGSTOP)  # frozen in the middle of a slice, lease and all
    try:
        wait_for(lambda: reap_expired_leases() == 1, 20, interval=0.2, what="the reaper to take the job back")

        def new_owner_checkpointed():
            now = Job.objects.get(pk=job.pk)
            return now if now.state == "running" and _claim_of(now.checkpoint_files[0]) == now.dispatch_token else None

        new = wait_for(new_owner_checkpointed, 30, what="the new owner to checkpoint")
        assert new.worker != old.worker and new.dispatch_token != old_claim
    finally:
        os.killpg(group, signal.SIGCONT)  # the old worker carries on with its slice

    (job,) = wait_finished(job, timeout=90)
    assert job.state == "succeeded"
    # The old worker's late boundary found its claim gone and wrote nothing: every slice and
    # event after the reaper's is the new owner's.
    reaped = job.events.get(actor="reaper")
    assert not job.events.filter(at__gt=reaped.at, actor=old.worker).exists()
    assert not job.slices.filter(started_at__gte=reaped.at, worker=old.worker).exists()
    assert all(_claim_of(name) != old_claim for name in job.checkpoint_files)
    for name in job.checkpoint_files:
        assert _store().read(job.pk, name)  # intact
    assert_no_overlap(job)
    assert sum(job.slices.values_list("steps", flat=True)) >= 1500


def test_sigterm_flushes_the_persists_in_flight(start_workers, alice):
    workers = start_workers(gpus=1)
    job = submit(alice, "SP", "flush-me", steps=100_000, step_ms=5, state_kb=480 * MB_KB)
    wait_for(lambda: Job.objects.get(pk=job.pk).progress > 0.0005, 60, what="the job to make progress")

    workers.stop()

    job.refresh_from_db()
    assert job.state == "queued" and job.events.filter(reason="worker shutting down").exists()
    # The stopping worker wrote the snapshot it took before it exited: the file is there, whole.
    assert len(_store().read(job.pk, job.checkpoint_files[0])) == 16 + 480 * MB_KB * 1024
