"""An RT job gets a GPU within one step of a lower tier's slice, not at the slice's end; an
operator's cancel takes effect within one step too."""

from __future__ import annotations

import pytest

from tests.harness import wait_for
from tests.helpers import submit, wait_finished
from webapp.models import Job, JobEvent, QueueTier
from webapp.services import cancel_job

pytestmark = pytest.mark.integration

LONG_SLICES = {"CLOCKQ_OVERHEAD_BUDGET": "0"}


@pytest.fixture
def sp_slices_of_500_ms(transactional_db):
    QueueTier.objects.filter(code="SP").update(base_slice_ms=500, min_slice_ms=20)


def test_rt_starts_within_a_step_on_two_busy_gpus(start_workers, alice, sp_slices_of_500_ms):
    start_workers(gpus=2, **LONG_SLICES)
    busy = [submit(alice, "SP", f"busy{i}", steps=200, step_ms=10) for i in range(2)]
    wait_for(lambda: Job.objects.filter(state="running").count() == 2, 20, what="both GPUs to be busy")
    # Let both get well into a 500 ms slice.
    wait_for(lambda: all(j.slices.exists() for j in Job.objects.filter(pk__in=[b.pk for b in busy])), 10,
             what="a first slice on each GPU")  # fmt: skip

    rt = submit(alice, "RT", "inference", steps=2, step_ms=5)
    (rt,) = wait_finished(rt)

    start_latency_ms = (rt.first_started_at - rt.submitted_at).total_seconds() * 1000
    # Generous: one 10 ms step plus a switch, far below the 500 ms the slice would have run.
    assert start_latency_ms < 250, start_latency_ms
    cut_short = Job.objects.filter(pk__in=[b.pk for b in busy], slices__outcome="yielded", slices__used_ms__lt=400)
    assert cut_short.exists()
    # Both GPUs heard the signal, but only one made way for the one RT job.
    made_way = JobEvent.objects.filter(job__in=busy, reason="preempted by a waiting RT job")
    assert made_way.count() == 1
    for job in wait_finished(*busy):
        assert job.state == "succeeded"


def test_a_cancel_stops_a_running_slice_within_a_step(start_workers, alice, sp_slices_of_500_ms):
    start_workers(gpus=1, **LONG_SLICES)
    victim = submit(alice, "SP", "victim", steps=500, step_ms=10)
    wait_for(lambda: Job.objects.get(pk=victim.pk).slices.exists(), 20, what="the victim's first slice")
    waiting = submit(alice, "BK", "next-in-line", steps=1, step_ms=1)

    cancelled = cancel_job(Job.objects.get(pk=victim.pk), actor="alice")
    (waiting,) = wait_finished(waiting)

    # The GPU was free again well before the victim's 500 ms slice would have ended.
    freed_after_ms = (waiting.first_started_at - cancelled.finished_at).total_seconds() * 1000
    assert freed_after_ms < 250, freed_after_ms
    assert Job.objects.get(pk=victim.pk).state == "cancelled"


def test_a_hold_on_a_running_job_checkpoints_it_within_a_step(start_workers, alice, sp_slices_of_500_ms):
    from webapp.services import hold_job

    start_workers(gpus=1, **LONG_SLICES)
    job = submit(alice, "SP", "hold-me", steps=500, step_ms=10)
    wait_for(lambda: Job.objects.get(pk=job.pk).slices.exists(), 20, what="a first slice")

    hold_job(Job.objects.get(pk=job.pk), actor="alice")

    wait_for(lambda: Job.objects.get(pk=job.pk).state == "held", 2, what="the job to be held")
    job.refresh_from_db()
    assert job.checkpoint_generation == 1
    assert job.slices.order_by("-started_at").first().used_ms < 400
