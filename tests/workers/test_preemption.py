"""An urgent job (RT, HP) gets a GPU within one step of a lower tier's slice, not at the slice's
end, from the running job the order names (for RT the cheapest switch); every other busy GPU goes
on with its slice. An operator's cancel takes effect within one step too."""

from __future__ import annotations

import json
import os
import signal

import pytest

from clockq.bus.client import client
from clockq.jobs.models import Job, JobEvent, QueueTier, Slice
from clockq.jobs.services import cancel_job
from clockq.policy.slicing import PREEMPTED
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


def _running(*jobs: Job) -> None:
    ids = [j.pk for j in jobs]
    wait_for(lambda: Job.objects.filter(pk__in=ids, state="running").count() == len(ids), 20, what=f"jobs {ids} to run")


def _preempted_for(job: Job) -> str:
    return f"{PREEMPTED}: made way for job #{job.pk} ({job.tier.code}, "


def test_rt_takes_the_gpu_of_the_cheaper_switch_within_a_step(start_workers, alice, sp_slices_of_a_minute):
    start_workers(gpus=2, **LONG_SLICES)
    # Two busy GPUs; each job's switch cost as a worker measured it at its last yield. The cheap
    # one is the older: among equal costs RT would take the newer.
    cheap = submit(alice, "SP", "cheap", **ENDLESS)
    Job.objects.filter(pk=cheap.pk).update(switch_cost_ms=3.0)
    dear = submit(alice, "SP", "dear", **ENDLESS)
    Job.objects.filter(pk=dear.pk).update(switch_cost_ms=60.0)
    _running(cheap, dear)

    rt = submit(alice, "RT", "inference", steps=2, step_ms=5)
    (rt,) = wait_finished(rt, timeout=30)

    # The cheap job's minute-long slice ended at a step to make way; the other GPU heard the RT
    # job too, looked, and went on within its first slice, writing nothing.
    assert rt.state == "succeeded"
    cut = Slice.objects.get(job__in=[cheap, dear], outcome="yielded")
    assert cut.job_id == cheap.pk
    assert cut.planned_ms == SLICE_MS and cut.used_ms < cut.planned_ms  # cut short, not at its end
    assert cut.preempted  # marked on the job's metric curves
    made_way = JobEvent.objects.filter(job__in=[cheap, dear], reason__startswith=_preempted_for(rt))
    assert [e.job_id for e in made_way] == [cheap.pk]
    assert not Slice.objects.filter(job=dear).exists()
    assert Job.objects.get(pk=dear.pk).state == "running"
    for job in (cheap, dear):
        cancel_job(Job.objects.get(pk=job.pk), actor="alice")


def test_a_victim_whose_worker_hangs_is_passed_over_and_the_next_one_makes_way(
    start_workers, alice, sp_slices_of_a_minute
):
    start_workers(gpus=2, **LONG_SLICES)
    cheap = submit(alice, "SP", "cheap", **ENDLESS)
    Job.objects.filter(pk=cheap.pk).update(switch_cost_ms=3.0)
    dear = submit(alice, "SP", "dear", **ENDLESS)
    Job.objects.filter(pk=dear.pk).update(switch_cost_ms=60.0)
    _running(cheap, dear)
    # The cheap job's worker hangs (as a dead one would, its job stays running until the reaper
    # takes it back): the order names it to make way, and it never does
    group = _process_group_of(Job.objects.get(pk=cheap.pk).worker)
    os.killpg(group, signal.SIGSTOP)
    try:
        hp = submit(alice, "HP", "fine-tune", steps=2, step_ms=5)
        (hp,) = wait_finished(hp, timeout=30)
        # The other GPU looked again, passed the hung job over, and made way itself
        assert hp.state == "succeeded"
        made_way = JobEvent.objects.filter(job__in=[cheap, dear], reason__startswith=_preempted_for(hp))
        assert [e.job_id for e in made_way] == [dear.pk]
    finally:
        os.killpg(group, signal.SIGCONT)
    # Woken, the hung job's worker finds the urgent job gone, and goes on
    _running(cheap)
    assert not JobEvent.objects.filter(job=cheap, reason__startswith=_preempted_for(hp)).exists()


def _process_group_of(hostname: str) -> int:
    """The process group of the GPU worker `hostname`, from its heartbeat."""
    return os.getpgid(json.loads(client().get(f"clockq:worker:{hostname}"))["pid"])


def test_an_hp_job_interrupts_a_lower_tiers_slice_at_a_step(start_workers, alice, sp_slices_of_a_minute):
    start_workers(gpus=1, **LONG_SLICES)
    busy = submit(alice, "SP", "busy", **ENDLESS)
    _running(busy)

    hp = submit(alice, "HP", "finetune", steps=2, step_ms=5)
    (hp,) = wait_finished(hp, timeout=30)

    # Without the interrupt the HP job would have waited for the minute-long slice to end.
    assert hp.state == "succeeded"
    cut = Slice.objects.get(job=busy, outcome="yielded")
    assert cut.planned_ms == SLICE_MS and cut.used_ms < cut.planned_ms and cut.preempted
    assert busy.events.filter(reason__startswith=_preempted_for(hp)).count() == 1
    cancel_job(Job.objects.get(pk=busy.pk), actor="alice")


def test_an_rt_job_a_free_gpu_takes_makes_nobody_yield(start_workers, alice, sp_slices_of_a_minute):
    start_workers(gpus=2, **LONG_SLICES)
    busy = submit(alice, "SP", "busy", **ENDLESS)
    _running(busy)  # the other GPU is free, waiting on the broker

    rt = submit(alice, "RT", "inference", steps=2, step_ms=5)
    (rt,) = wait_finished(rt, timeout=30)

    # The busy GPU heard the RT job, found its message taken, and went on within its first
    # slice: no checkpoint, no requeue, not even a slice ended.
    assert rt.state == "succeeded"
    (ran,) = rt.slices.all()
    assert ran.worker != Job.objects.get(pk=busy.pk).worker
    assert not Slice.objects.filter(job=busy).exists()
    assert Job.objects.get(pk=busy.pk).state == "running"
    cancel_job(Job.objects.get(pk=busy.pk), actor="alice")


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
