"""Stopping the workers checkpoints and requeues the running job instead of losing it."""

from __future__ import annotations

import pytest

from clockq.jobs.models import Job, QueueTier
from tests.harness import wait_for
from tests.helpers import submit, wait_finished

pytestmark = pytest.mark.integration


def test_sigterm_checkpoints_the_running_job_and_a_new_worker_finishes_it(start_workers, alice):
    workers = start_workers(gpus=1)
    job = submit(alice, "SP", "long", steps=400, step_ms=10, state_kb=16)
    wait_for(lambda: Job.objects.get(pk=job.pk).progress > 0.05, 20, what="the job to make progress")

    workers.stop()

    job.refresh_from_db()
    assert job.state == "queued"
    assert job.checkpoint_generation == 1
    assert job.events.filter(reason="worker shutting down").exists()
    progress_at_stop = job.progress

    start_workers(gpus=1)
    (job,) = wait_finished(job)
    assert job.state == "succeeded"
    # It resumed from the checkpoint: about 400 steps in all, not 400 plus what ran before.
    assert sum(job.slices.values_list("steps", flat=True)) == 400
    assert progress_at_stop > 0.05


def test_sigterm_ends_a_long_slice_at_its_next_step_rather_than_at_its_planned_end(start_workers, alice):
    # Given a job in a slice planned a minute long, longer than the workers' stop grace (20 s)
    QueueTier.objects.filter(code="SP").update(base_slice_ms=60_000, min_slice_ms=20)
    workers = start_workers(gpus=1, CLOCKQ_OVERHEAD_BUDGET="0")
    job = submit(alice, "SP", "endless", steps=1_000_000, step_ms=10, state_kb=16)
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "running", 20, what="the job to run")

    # When the workers are stopped
    workers.stop()

    # Then its slice ended at a step and the job went back to its queue with a checkpoint; before,
    # the slice ran on until the supervisor killed the worker at its grace and the job was left
    # running, for the reaper
    job.refresh_from_db()
    assert job.state == "queued"
    assert job.checkpoint_generation == 1
    last = job.slices.order_by("started_at").last()
    assert last.outcome == "yielded"
    assert not job.slices.filter(outcome="lost").exists()
    assert job.events.filter(reason="worker shutting down").exists()
