"""Stopping the workers checkpoints and requeues the running job instead of losing it."""

from __future__ import annotations

import pytest

from clockq.jobs.models import Job
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
