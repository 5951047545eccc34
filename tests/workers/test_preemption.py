"""An RT job gets a GPU within one step of a lower tier's slice, not at the slice's end; an
operator's cancel takes effect within one step too."""

from __future__ import annotations

import pytest

from clockq.jobs.models import Job, JobEvent, QueueTier, Slice
from clockq.jobs.services import cancel_job
from tests.harness import wait_for
from tests.helpers import submit, wait_finished

pytestmark = pytest.mark.integration

LONG_SLICES = {"CLOCKQ_OVERHEAD_BUDGET": "0"}
# Slices of a minute, and jobs that would run for many: an interrupt that works ends a slice at
# the next 10 ms step; one that did not would leave the GPU busy far past every wait below. So
# these tests check behaviour with a margin of 100x or more, not a time budget.
SLICE_MS = 60_000
ENDLESS = {"steps": 1_000_000, "step_ms": 10}


@pytest.fixture
def sp_slices_of_a_minute(transactional_db):
    QueueTier.objects.filter(code="SP").update(base_slice_ms=SLICE_MS, min_slice_ms=20)


def test_rt_starts_within_a_step_on_two_busy_gpus(start_workers, alice, sp_slices_of_a_minute):
    start_workers(gpus=2, **LONG_SLICES)
    busy = [submit(alice, "SP", f"busy{i}", **ENDLESS) for i in range(2)]
    wait_for(lambda: Job.objects.filter(state="running").count() == 2, 20, what="both GPUs to be busy")

    rt = submit(alice, "RT", "inference", steps=2, step_ms=5)
    (rt,) = wait_finished(rt, timeout=30)

    # One busy job's minute-long slice ended at a step to make way; the other GPU kept going.
    assert rt.state == "succeeded"
    cut = Slice.objects.get(job__in=busy, outcome="yielded")
    assert cut.planned_ms == SLICE_MS and cut.used_ms < cut.planned_ms  # cut short, not at its end
    assert cut.preempted  # marked on the job's metric curves
    made_way = JobEvent.objects.filter(job__in=busy, reason="preempted by a waiting RT job")
    assert made_way.count() == 1
    for job in busy:
        cancel_job(Job.objects.get(pk=job.pk), actor="alice")


def test_a_cancel_stops_a_running_slice_within_a_step(start_workers, alice, sp_slices_of_a_minute):
    start_workers(gpus=1, **LONG_SLICES)
    victim = submit(alice, "SP", "victim", **ENDLESS)
    wait_for(lambda: Job.objects.get(pk=victim.pk).state == "running", 20, what="the victim to start")
    waiting = submit(alice, "BK", "next-in-line", steps=1, step_ms=1)

    cancel_job(Job.objects.get(pk=victim.pk), actor="alice")

    # The GPU is free long before the victim's minute-long slice would have ended.
    (waiting,) = wait_finished(waiting, timeout=SLICE_MS / 1000 / 2)
    assert waiting.state == "succeeded"
    assert Job.objects.get(pk=victim.pk).state == "cancelled"


def test_a_hold_on_a_running_job_checkpoints_it_within_a_step(start_workers, alice, sp_slices_of_a_minute):
    from clockq.jobs.services import hold_job

    start_workers(gpus=1, **LONG_SLICES)
    job = submit(alice, "SP", "hold-me", **ENDLESS)
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "running", 20, what="the job to start")

    hold_job(Job.objects.get(pk=job.pk), actor="alice")

    wait_for(lambda: Job.objects.get(pk=job.pk).state == "held", SLICE_MS / 1000 / 2, what="the job to be held")
    job.refresh_from_db()
    assert job.checkpoint_generation == 1
    held_slice = job.slices.get()
    assert held_slice.outcome == "yielded" and held_slice.used_ms < held_slice.planned_ms
