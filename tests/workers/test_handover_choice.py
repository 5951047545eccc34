"""The hand-over takes the job the boundary's decision chose (`order.make_way`, read at that
boundary), guarded by the claim's compare-and-set: it does not read the order again."""

from __future__ import annotations

import pytest
from django.test import override_settings

from clockq.jobs.models import Job, JobEvent
from tests.helpers import after_the_claim, submit
from workers.runtime import Runtime, WorkerIdentity
from workers.slice_runner import RunOutcome, run_dispatch

pytestmark = pytest.mark.django_db(transaction=True)


@override_settings(CLOCKQ_OVERHEAD_BUDGET=0)
def test_a_hand_over_takes_the_job_its_boundary_chose_without_reading_the_order_again(alice, monkeypatch):
    # Given a long-served SP job, and a new SP job (level 0, so it comes first) that arrives once
    # the long one holds the GPU
    long = submit(alice, "SP", "long", steps=400, step_ms=1, state_kb=4)
    Job.objects.filter(pk=long.pk).update(run_ms=60_000)  # past every rung of the tests' ladder
    new: list[Job] = []
    # A second read of the order would name nobody: only the boundary's choice can hand it over
    monkeypatch.setattr("clockq.jobs.order.next_for_gpu", lambda *_args: None)
    here = Runtime(WorkerIdentity("gpu0@test", 0))

    with after_the_claim(lambda: new.append(submit(alice, "SP", "new", steps=3, step_ms=1))):
        outcome = run_dispatch(long.pk, long.dispatch_token, here)

    # Then the long job yielded to it, and this dispatch ran it to its end, with no broker delivery
    assert outcome == RunOutcome.YIELDED
    (new_job,) = new
    new_job.refresh_from_db()
    assert new_job.state == "succeeded"
    claim = JobEvent.objects.get(job=new_job, from_state="queued", to_state="running")
    assert claim.actor == "gpu0@test"
    yielded = JobEvent.objects.get(job=long, from_state="running", to_state="queued")
    assert f"made way for job #{new_job.pk} " in yielded.reason
