"""A running job's look when an urgent job is announced (workers/run/boundary.py), with a worker
in this process: a GPU that only seems free does not hold the urgent job back, and a database
fault during a look is not the job's failure."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from clockq.bus import free_gpus, signals
from clockq.bus.client import client
from clockq.jobs import order
from clockq.jobs.models import Job, QueueTier
from clockq.policy.slicing import PREEMPTED
from tests.helpers import after_the_restore, submit
from workers.runtime import Runtime, WorkerIdentity
from workers.slice_runner import RunOutcome, run_dispatch

pytestmark = pytest.mark.django_db(transaction=True)

SLICE_MS = 60_000  # a slice far longer than any wait below: the job leaves at a step, or never


@pytest.fixture
def long_sp_slices(settings):
    settings.CLOCKQ_OVERHEAD_BUDGET = 0
    QueueTier.objects.filter(code="SP").update(base_slice_ms=SLICE_MS, min_slice_ms=20)


def _runtime() -> Runtime:
    runtime = Runtime(WorkerIdentity("gpu0@test", 0))
    assert signals.wait_until_listening(5)
    return runtime


def test_a_gpu_that_left_its_job_and_took_nothing_stops_counting_as_free(alice, long_sp_slices):
    # Given a worker that left its job just now and then died: for a moment its GPU looks free
    busy = submit(alice, "SP", "busy", steps=5_000, step_ms=2)  # 10 s of work
    here = _runtime()
    arrived: list[Job] = []

    def rt_arrives():
        free_gpus.mark_free(client(), "gpu9@gone")
        arrived.append(submit(alice, "RT", "inference", steps=1))
        here.threads.interrupts.heard_urgent(0)

    # When an RT job arrives, the busy job's look counts that GPU free and goes on; it looks
    # again once the GPU no longer counts, finds the RT job still waiting, and makes way
    with after_the_restore(rt_arrives):
        assert run_dispatch(busy.pk, busy.dispatch_token, here) == RunOutcome.YIELDED

    (cut,) = Job.objects.get(pk=busy.pk).slices.all()
    assert cut.planned_ms == SLICE_MS and cut.used_ms < SLICE_MS and cut.preempted
    preempted = f"{PREEMPTED}: made way for job #{arrived[0].pk} (RT, "
    assert Job.objects.get(pk=busy.pk).events.filter(reason__startswith=preempted).exists()


def test_a_database_fault_during_a_look_is_not_the_jobs_failure(alice, long_sp_slices, monkeypatch):
    busy = submit(alice, "SP", "busy", steps=40, step_ms=2)  # done well before its slice's end
    here = _runtime()
    make_way = order.make_way

    def faulty(*args, **kwargs):
        if kwargs.get("held_s") is not None:  # a look's read, during the slice
            raise OperationalError("the database went away for a moment")
        return make_way(*args, **kwargs)

    monkeypatch.setattr(order, "make_way", faulty)

    with after_the_restore(
        lambda: (submit(alice, "RT", "inference", steps=1), here.threads.interrupts.heard_urgent(0))
    ):
        outcome = run_dispatch(busy.pk, busy.dispatch_token, here)

    # The look went on; the job was not charged, and finished its work
    assert outcome == RunOutcome.SUCCEEDED
    assert Job.objects.get(pk=busy.pk).failures == 0
