"""A slice whose steps the job runs again is marked rolled back, so that the steps of a job's
slices that are not add up to exactly its steps: after a checkpoint that died with its writer."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings

from clockq.jobs.checkpoints import CheckpointStore
from clockq.jobs.models import Job, Slice
from tests.helpers import submit
from workers.runtime import Runtime, WorkerIdentity
from workers.slice_runner import RunOutcome, run_dispatch

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 400


def _dispatch(job_id: int, runtime: Runtime) -> RunOutcome:
    job = Job.objects.get(pk=job_id)
    outcome = run_dispatch(job.pk, job.dispatch_token, runtime)
    runtime.persister.flush()  # its checkpoint is written in the background
    return outcome


def _kept_steps(job_id: int) -> int:
    return sum(Slice.objects.filter(job_id=job_id, rolled_back=False).values_list("steps", flat=True))


# Without the overhead rule: on a loaded machine a slow first claim would stretch a slice past
# the job's remaining work, and it would finish instead of yielding.
@override_settings(CLOCKQ_OVERHEAD_BUDGET=0)
def test_the_slice_whose_checkpoint_died_with_its_writer_is_rolled_back_and_the_kept_steps_add_up(alice):
    # Given a job that yielded twice on gpu0 (a rival waits, so it yields at every boundary),
    # its second checkpoint lost as when gpu0 is killed with that persist in flight: the job
    # names generation 2, but the file is not there and no writer's mark says it is coming
    job = submit(alice, "SP", "victim", steps=STEPS, step_ms=1, state_kb=4)
    submit(alice, "SP", "rival", steps=1)
    gpu0 = Runtime(WorkerIdentity("gpu0@test", 0))
    assert _dispatch(job.pk, gpu0) == RunOutcome.YIELDED
    assert _dispatch(job.pk, gpu0) == RunOutcome.YIELDED
    job.refresh_from_db()
    assert job.checkpoint_generation == 2
    CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR).path(job.pk, job.checkpoint_files[0]).unlink()
    lost = Slice.objects.get(job_id=job.pk, checkpoint_generation=2)
    assert lost.steps > 0

    # When another worker takes it: it falls back to generation 1, and runs it to the end
    gpu1 = Runtime(WorkerIdentity("gpu1@test", 1))
    for _claim in range(STEPS):  # every claim runs at least one step
        if _dispatch(job.pk, gpu1) == RunOutcome.SUCCEEDED:
            break
    job.refresh_from_db()
    assert job.state == "succeeded"
    note = job.events.get(reason__contains="unusable").reason
    assert "generation 2 unusable" in note and "restored generation 1" in note

    # Then the slice that took generation 2 ran its steps for nothing, and says so; the others
    # hold each step once
    assert list(Slice.objects.filter(job_id=job.pk, rolled_back=True)) == [lost]
    assert _kept_steps(job.pk) == STEPS
    assert sum(job.slices.values_list("steps", flat=True)) == STEPS + lost.steps
