"""Snapshot-then-persist under faults, with real worker processes: a worker killed with a persist
in flight, a worker frozen until its job has a new owner, a worker stopped with SIGTERM."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from django.conf import settings

from clockq.jobs.checkpoints import CheckpointStore, generation_of
from clockq.jobs.models import Job
from clockq.stack.roles import gpu_worker_argv
from control.reaper import reap_expired_leases
from control.reconcile import reconcile_queued_jobs
from tests.harness import ROOT, ZOMBIE, Service, process_stat, wait_for
from tests.helpers import assert_no_overlap, database_url, submit, wait_finished
from workers.gpus import gpu_worker_env, simulated_gpus

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


def _gated_worker(redis_url: str, gate: Path, log_path: Path, **env: str) -> Service:
    """A GPU worker on clockq's app whose checkpoint writes hold while `gate` exists
    (tests/workers/persist_gate_app.py), as `manage.py gpuworkers` would start gpu0."""
    argv = gpu_worker_argv(0)
    argv[argv.index("clockq")] = "tests.workers.persist_gate_app"  # -A: the app
    env = {
        **os.environ,
        **gpu_worker_env(simulated_gpus(1)[0]),
        "DATABASE_URL": database_url(),
        "REDIS_URL": redis_url,
        "CLOCKQ_CHECKPOINT_DIR": str(settings.CLOCKQ_CHECKPOINT_DIR),
        "CLOCKQ_TEST_PERSIST_GATE": str(gate),
        **env,
    }
    return Service("gated gpu0", argv, env, ROOT, log_path).start()


def test_a_worker_killed_with_a_persist_in_flight_loses_only_what_was_in_flight(
    start_workers, redis_server, alice, tmp_path
):
    # Two jobs take turns on one GPU with big states. The default wait bound (30 s): the claim
    # must see for itself that nobody writes the file.
    gate = tmp_path / "persist-gate"
    held = tmp_path / "persist-gate.held"
    log_path = tmp_path / "gated.log"
    gated = _gated_worker(redis_server.url, gate, log_path, CLOCKQ_OVERHEAD_BUDGET="0", CLOCKQ_LEASE_S="2")
    try:
        jobs = [submit(alice, "SP", f"big-{x}", steps=3000, step_ms=2, state_kb=96 * MB_KB) for x in "ab"]
        ids = [job.pk for job in jobs]
        store = _store()

        def checkpointed_twice():
            gated.check_alive()
            return Job.objects.filter(pk__in=ids, checkpoint_generation__gte=2).count() == 2

        wait_for(checkpointed_twice, 120, what="two checkpoints")

        def newest_not_on_disk(job_id: int):
            """(job, its newest named checkpoint, the newest on disk) if the newest is not on disk."""
            files = Job.objects.get(pk=job_id).checkpoint_files
            on_disk = [f for f in files if store.path(job_id, f).exists()]
            if files and on_disk and files[0] not in on_disk:
                return job_id, files[0], on_disk[0]
            return None

        def held_in_flight():
            """A job whose newest named checkpoint is a write held at the gate."""
            gated.check_alive()
            for line in held.read_text().splitlines() if held.exists() else []:
                job_id, name = line.split()
                caught = newest_not_on_disk(int(job_id))
                if caught and caught[1] == name:
                    return caught
            return None

        # When the worker is killed while a persist is held in flight
        gate.touch()
        job_id = wait_for(held_in_flight, 120, what="a persist held in flight")[0]
        _kill_and_wait({gated.proc.pid})  # a session of its own: its process group is its pid
    finally:
        gated.stop()
    gate.unlink(missing_ok=True)
    # Read again once it is dead: it may have yielded that job again meanwhile, naming a newer
    # generation whose snapshot waited behind the held one (and died with it too).
    victim = newest_not_on_disk(job_id)
    assert victim is not None, "the held write finished"
    job_id, lost, durable = victim

    # Then a worker as `manage.py gpuworkers` starts it takes over, and the reaper takes back
    # the job that was running. The reconciler does what beat has it do every 15 s: a kill just
    # after the worker took the other job's wake-up off the list, before kombu recorded it as
    # unacked, loses that message (in neither the list nor the unacked hash), and only the
    # reconciler sends it again.
    start_workers(gpus=1, CLOCKQ_OVERHEAD_BUDGET="0", CLOCKQ_LEASE_S="2")

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
