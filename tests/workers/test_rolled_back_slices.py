"""A slice whose steps the job runs again is marked rolled back, so that the steps of a job's
slices that are not add up to exactly its steps: after a checkpoint that died with its writer,
after a failed slice, and after a lost worker."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from clockq.jobs.checkpoints import CheckpointStore, checkpoint_name
from clockq.jobs.models import Job, Slice
from clockq.policy.slicing import SliceOutcome
from control.reaper import reap_expired_leases
from tests.helpers import submit, yield_once
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
    # Given a job that yielded twice on gpu0 (an HP job arrives each time, so it yields after a
    # slice), its second checkpoint lost as when gpu0 is killed with that persist in flight: the
    # job names generation 2, but the file is not there and no writer's mark says it is coming
    job = submit(alice, "SP", "victim", steps=STEPS, step_ms=1, state_kb=4)
    gpu0 = Runtime(WorkerIdentity("gpu0@test", 0))
    yield_once(job, gpu0)
    yield_once(Job.objects.get(pk=job.pk), gpu0)
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


@pytest.mark.parametrize("checkpoint_every_s", [0, 0.001], ids=["no-periodic-checkpoint", "at-every-boundary"])
def test_a_failed_slice_and_those_before_it_that_no_checkpoint_holds_are_rolled_back(
    alice, settings, checkpoint_every_s
):
    # Given a job that fails once at step 200 (several slices in), with no periodic checkpoint,
    # or one at every boundary where it continues
    settings.CLOCKQ_CHECKPOINT_EVERY_S = checkpoint_every_s
    settings.CLOCKQ_OVERHEAD_BUDGET = 0
    job = submit(alice, "SP", "flaky", steps=300, step_ms=1, state_kb=4, fail_at_step=200, fail_times=1)
    gpu0 = Runtime(WorkerIdentity("gpu0@test", 0))

    # When it fails, is rolled back, and retried
    assert _dispatch(job.pk, gpu0) == RunOutcome.RETRYING
    first_claim = list(job.slices.order_by("id"))
    assert _dispatch(job.pk, gpu0) == RunOutcome.SUCCEEDED

    # Then the failed slice, and every slice of that claim after the checkpoint it went back
    # to, are rolled back; those that checkpoint holds are not. (A slice that ran no step, as a
    # failed one can when it fails at its first, has nothing to roll back and stays unmarked.)
    failed = first_claim[-1]
    assert failed.outcome == SliceOutcome.FAILED
    took = [s.id for s in first_claim if s.checkpoint_generation is not None]
    if checkpoint_every_s:
        assert took, "the claim continued at least once before it failed"
    back_to = max(took, default=0)
    for s in Slice.objects.filter(id__in=[s.id for s in first_claim]):
        assert s.rolled_back == (s.id > back_to and s.steps > 0), (s.id, s.outcome, s.steps, s.checkpoint_generation)
    assert _kept_steps(job.pk) == 300


def test_the_reaper_rolls_back_the_slices_recorded_after_the_checkpoint_the_job_resumes_from(alice):
    # Given two jobs taken from a worker that stopped renewing its lease: one checkpointed at
    # its first slice and not at its second, the other never checkpointed
    start = timezone.now() - timedelta(minutes=1)
    ids = []
    for name, files in (("checkpointed", [checkpoint_name(1, "a" * 32)]), ("never", [])):
        job = submit(alice, "SP", name, steps=100)
        Job.objects.filter(pk=job.pk).update(
            state="running",
            worker="gpu0@gone",
            lease_expires_at=start + timedelta(seconds=3),
            checkpoint_files=files,
            checkpoint_generation=len(files),
        )
        for i, generation in enumerate([len(files) or None, None]):
            Slice.objects.create(
                job_id=job.pk,
                worker="gpu0@gone",
                gpu_index=0,
                started_at=start + timedelta(seconds=i),
                ended_at=start + timedelta(seconds=i + 1),
                planned_ms=1000,
                used_ms=1000,
                steps=10,
                outcome=SliceOutcome.CONTINUED,
                checkpoint_generation=generation,
            )
        ids.append(job.pk)

    # When the reaper takes them back
    assert reap_expired_leases() == 2

    # Then what the checkpoint they resume from holds is kept, and the rest is rolled back; the
    # lost slice ran no recorded step
    def marks(job_id):
        return list(Slice.objects.filter(job_id=job_id).order_by("id").values_list("outcome", "rolled_back"))

    checkpointed, never = ids
    assert marks(checkpointed) == [("continued", False), ("continued", True), ("lost", False)]
    assert marks(never) == [("continued", True), ("continued", True), ("lost", False)]
