"""A failing workload rolls back to its last good checkpoint; a corrupt checkpoint falls back."""

from __future__ import annotations

import pytest
from django.conf import settings

from clockq.jobs.checkpoints import CheckpointStore, checkpoint_name
from clockq.jobs.models import Job
from tests.helpers import submit, wait_finished
from workers.runtime import Runtime, WorkerIdentity
from workers.slice_runner import RunOutcome, run_dispatch
from workers.workloads.base import RunContext
from workers.workloads.synthetic import SyntheticWorkload

pytestmark = pytest.mark.django_db(transaction=True)


def _synthetic_state(job_id: int, params: dict, steps_done: int, tmp_path) -> bytes:
    workload = SyntheticWorkload(params)
    workload.setup(RunContext(job_id, 0, tmp_path))
    workload.done = steps_done
    return workload.state_dict()


def test_a_corrupted_newest_checkpoint_falls_back_to_the_previous_generation(alice, tmp_path, settings):
    # Given a job with two checkpoint generations (10 and 20 steps done), the newest corrupted,
    # that checkpoints at every slice boundary from now on (30 steps of 5 ms: several slices)
    settings.CLOCKQ_CHECKPOINT_EVERY_S = 0.001
    job = submit(alice, "SP", "resume-me", steps=40, step_ms=5, state_kb=4)
    store = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR)
    names = [checkpoint_name(gen, "a" * 32) for gen in (2, 1)]
    store.write(job.pk, names[1], _synthetic_state(job.pk, job.params, 10, tmp_path))
    store.write(job.pk, names[0], _synthetic_state(job.pk, job.params, 20, tmp_path))
    newest = store.path(job.pk, names[0])
    newest.write_bytes(newest.read_bytes()[:-100])
    Job.objects.filter(pk=job.pk).update(checkpoint_generation=2, checkpoint_files=names, progress=0.5)

    # When a worker runs it (here, in this process: the same code a Celery worker calls)
    assert run_dispatch(job.pk, job.dispatch_token, Runtime(WorkerIdentity("gpu0@test", 0))) == RunOutcome.SUCCEEDED

    # Then it resumed from generation 1: 30 more steps, not 20, and says why
    job.refresh_from_db()
    assert job.state == "succeeded"
    assert sum(job.slices.values_list("steps", flat=True)) == 30
    note = job.events.get(from_state="running", to_state="running").reason
    assert "generation 2 unusable" in note and "truncated" in note and "restored generation 1" in note
    # Generation numbers only grow: the next checkpoints were 3, 4, ..., never a second 2.
    checkpointed = job.slices.filter(checkpoint_bytes__gt=0).count()
    assert checkpointed >= 1 and job.checkpoint_generation == 2 + checkpointed


def test_a_workload_that_raises_once_is_rolled_back_and_retried(start_workers, alice):
    start_workers(gpus=1)
    job = submit(alice, "SP", "flaky", steps=20, step_ms=5, fail_at_step=12, fail_times=1)
    (job,) = wait_finished(job)

    assert job.state == "succeeded"
    assert job.failures == 1
    assert job.slices.filter(outcome="failed").count() == 1
    # Rolled back to the start (no checkpoint yet), so 12 + 20 steps ran in all.
    assert sum(job.slices.values_list("steps", flat=True)) == 32
    assert job.events.filter(reason__contains="rolled back to checkpoint generation 0").exists()
    assert "injected failure at step 12" in job.last_error


def test_a_workload_that_always_raises_ends_failed_with_the_error_shown(start_workers, alice, client):
    start_workers(gpus=1)
    job = submit(alice, "SP", "broken", steps=20, step_ms=1, fail_at_step=3, fail_times=1000)
    (job,) = wait_finished(job)

    assert job.state == "failed"
    assert job.failures == settings.CLOCKQ_MAX_RETRIES + 1
    assert job.slices.filter(outcome="failed").count() == settings.CLOCKQ_MAX_RETRIES + 1
    client.force_login(alice)
    api = client.get(f"/api/jobs/{job.pk}").json()
    assert api["state"] == "failed" and "injected failure at step 3" in api["last_error"]
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "injected failure at step 3" in page
