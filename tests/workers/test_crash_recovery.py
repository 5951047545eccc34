"""A worker killed with kill -9 mid-slice loses nothing: its lease expires, the reaper takes the
job back, and another worker finishes it from its last checkpoint."""

from __future__ import annotations

import json
import os
import signal

import pytest
from django.test import override_settings

from clockq.bus.client import client
from clockq.jobs.models import Job
from clockq.policy.states import TERMINAL_STATES
from control.reaper import reap_expired_leases
from tests.harness import wait_for
from tests.helpers import assert_no_overlap, submit, wait_finished

pytestmark = pytest.mark.integration


def _worker_pid(hostname: str) -> int:
    return json.loads(client().get(f"clockq:worker:{hostname}"))["pid"]


@override_settings(CLOCKQ_LEASE_S=2.0)
def test_kill_9_mid_slice_the_job_finishes_elsewhere_from_its_last_checkpoint(start_workers, alice):
    # Checkpoint often, keep leases short, so the test is quick.
    start_workers(gpus=2, CLOCKQ_LEASE_S="2", CLOCKQ_CHECKPOINT_EVERY_S="0.3")
    job = submit(alice, "SP", "survivor", steps=300, step_ms=10, state_kb=8)
    wait_for(lambda: Job.objects.get(pk=job.pk).checkpoint_generation >= 2, 30, what="two checkpoints")
    victim = Job.objects.get(pk=job.pk).worker
    assert victim.startswith("gpu")

    os.kill(_worker_pid(victim), signal.SIGKILL)  # the pool child dies with its parent

    # Nothing renews the lease now; within about 2 s the reaper takes the job back.
    wait_for(lambda: reap_expired_leases() == 1, 20, interval=0.2, what="the reaper to take the job back")
    (job,) = wait_finished(job, timeout=60)

    assert job.state == "succeeded"
    lost = job.slices.get(outcome="lost")
    assert lost.worker == victim
    reaped = job.events.get(actor="reaper")
    generation = int(reaped.reason.rsplit("generation ", 1)[1])
    assert generation >= 2
    # It resumed from that checkpoint, not from the beginning.
    steps_after = sum(job.slices.filter(started_at__gt=lost.ended_at).values_list("steps", flat=True))
    assert 0 < steps_after < 300
    assert_no_overlap(job)
    assert reap_expired_leases() == 0
    # Its loss curve holds each step once, 1 to 300: the lost slice added no point past the
    # checkpoint the job resumed from, and the rerun's points are there once.
    from clockq.jobs.metrics import curves

    steps = [step for step, _value in curves(job.pk)["loss"]["points"]]
    assert steps == list(range(1, 301))


def test_a_late_completion_from_a_lost_worker_cannot_overwrite_the_new_run(alice, transactional_db):
    # Given a job taken back by the reaper from a worker that is only slow, not dead
    job = submit(alice, "SP", "slow-worker", steps=10)
    old_token = job.dispatch_token
    Job.objects.filter(pk=job.pk).update(state="running", worker="gpu0@old", lease_expires_at="2000-01-01T00:00Z")
    assert reap_expired_leases() == 1
    job.refresh_from_db()
    assert job.state == "queued" and job.dispatch_token != old_token
    from clockq.bus.counters import read_counters

    assert read_counters().slices[("SP", "lost")] == 1  # for /metrics

    # When the old worker finally reports its slice end with the token it had
    from clockq.jobs.transitions import transition
    from clockq.policy.states import JobState

    late = transition(
        job.pk, to=JobState.SUCCEEDED, expect={JobState.RUNNING}, token=old_token, reason="late", actor="gpu0@old"
    )

    # Then it changes nothing
    assert late is None
    assert Job.objects.get(pk=job.pk).state == "queued"


def test_a_healthy_worker_keeps_its_lease_through_a_long_step(start_workers, alice, settings):
    settings.CLOCKQ_LEASE_S = 1.0
    start_workers(gpus=1, CLOCKQ_LEASE_S="1")
    job = submit(alice, "SP", "long-steps", steps=3, step_ms=1500)  # each step outlasts the lease
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "running", 20, what="the job to start")

    def never_reaped_until_done() -> bool:
        assert reap_expired_leases() == 0
        return Job.objects.get(pk=job.pk).state in TERMINAL_STATES

    wait_for(never_reaped_until_done, 60, interval=0.2, what="the job to finish")
    (job,) = wait_finished(job)
    assert job.state == "succeeded" and not job.slices.filter(outcome="lost").exists()
