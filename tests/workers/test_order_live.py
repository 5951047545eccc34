"""The order (clockq/policy/ordering.py) on real GPU worker processes, through a real broker:
service levels, fair share between users, the victim a waiting job takes, and no turns within
a class."""

from __future__ import annotations

import pytest

from clockq.jobs.models import Job, JobEvent
from clockq.policy.ordering import BASE_LADDER_GPU_S
from tests.harness import wait_for
from tests.helpers import submit, wait_finished

pytestmark = pytest.mark.integration


def _started(job: Job, slices: int = 1) -> None:
    wait_for(
        lambda: Job.objects.get(pk=job.pk).slice_count >= slices, 30, what=f"job {job.pk} to run {slices} slice(s)"
    )


def test_new_jobs_start_before_a_long_served_one_finishes_urgent_tier_first(start_workers, alice):
    start_workers(gpus=1)
    long = submit(alice, "SP", "long", steps=150, step_ms=10, state_kb=4)
    _started(long, slices=6)  # 300 ms of service: level 4 of SP's ladder in tests (tests.helpers.SHORT_LADDER)
    sp = submit(alice, "SP", "new-sp", steps=2, step_ms=5)
    bk = submit(alice, "BK", "new-bk", steps=2, step_ms=5)

    long, sp, bk = wait_finished(long, sp, bk)  # in id order

    assert {long.state, bk.state, sp.state} == {"succeeded"}
    # Both new jobs are at level 0: they come before the long one, and SP before BK
    assert sp.first_started_at < bk.first_started_at < long.finished_at
    assert long.slices.filter(outcome="yielded").exists()
    reasons = JobEvent.objects.filter(job=long, from_state="running", to_state="queued").values_list(
        "reason", flat=True
    )
    assert any(f"made way for job #{sp.pk} (SP, service level 0)" in r for r in reasons), list(reasons)


def test_within_a_class_the_first_come_keeps_its_gpu(start_workers, alice, settings):
    # With the default ladder no job of a test passes a rung: all are of one class, and nobody
    # takes turns (processor sharing would slow both and finish neither sooner).
    settings.CLOCKQ_SERVICE_LADDER_S = list(BASE_LADDER_GPU_S)
    start_workers(gpus=1)
    first = submit(alice, "SP", "first", steps=40, step_ms=10, state_kb=4)
    _started(first)
    second = submit(alice, "SP", "second", steps=5, step_ms=10, state_kb=4)

    first, second = wait_finished(first, second)

    assert not first.slices.filter(outcome="yielded").exists()
    assert first.finished_at <= second.first_started_at


def test_a_user_with_one_job_goes_before_a_user_with_many(start_workers, alice, bob, settings):
    settings.CLOCKQ_SERVICE_LADDER_S = list(BASE_LADDER_GPU_S)  # one class: only the share orders them
    start_workers(gpus=1)
    bobs = [submit(bob, "BK", f"bob-{i}", steps=6, step_ms=10) for i in range(5)]
    _started(bobs[0])  # bob now has service in BK
    alices = submit(alice, "BK", "alice-1", steps=6, step_ms=10)

    finished = wait_finished(alices, *bobs)

    alices, bobs = finished[0], finished[1:]
    assert all(j.state == "succeeded" for j in finished)
    # Submitted after all of bob's, alice's job starts right after the one that was running
    assert all(alices.first_started_at < b.first_started_at for b in bobs[1:])


def test_the_job_furthest_back_in_the_order_makes_way(start_workers, alice):
    start_workers(gpus=2)
    sp = submit(alice, "SP", "sp", steps=300, step_ms=10, state_kb=4)
    bk = submit(alice, "BK", "bk", steps=300, step_ms=10, state_kb=4)
    _started(sp, slices=4)
    _started(bk, slices=4)
    # Both have passed rungs; BK's ladder is the shorter, so it is placed further back
    hp = submit(alice, "HP", "hp", steps=2, step_ms=5)

    wait_for(lambda: Job.objects.get(pk=hp.pk).state == "succeeded", 30, what="the HP job to finish")

    made_way = JobEvent.objects.filter(reason__contains=f"made way for job #{hp.pk} ").values_list("job_id", flat=True)
    assert list(made_way) == [bk.pk]
    assert all(j.state == "succeeded" for j in wait_finished(sp, bk))


@pytest.mark.slow  # ten GPU workers saturated with HP work; CI's slow pass runs it (the share's rule: tests/policy)
def test_under_saturation_the_best_effort_tiers_get_their_bounded_share(start_workers, alice, settings):
    # Ten GPUs (a tenth of them is one GPU: the best-effort tiers' share), busy with HP work that
    # ends one GPU at a time; the default ladder, so that no job passes a rung and only the tier
    # and the share order them.
    settings.CLOCKQ_SERVICE_LADDER_S = list(BASE_LADDER_GPU_S)
    start_workers(gpus=10)
    busy = [submit(alice, "HP", f"busy-{i}", steps=40 * (i + 1), step_ms=25) for i in range(10)]
    wait_for(lambda: Job.objects.filter(pk__in=[j.pk for j in busy], state="running").count() == 10, 60,
             what="ten HP jobs on the ten GPUs")  # fmt: skip
    # Then two BK jobs, and after them more HP work than there are GPUs to come free
    bk = [submit(alice, "BK", f"bk-{i}", steps=400, step_ms=25) for i in range(2)]
    more_hp = [submit(alice, "HP", f"more-hp-{i}", steps=2, step_ms=5) for i in range(5)]

    done = wait_finished(*bk, *more_hp, timeout=120)
    bk, more_hp = done[:2], done[2:]

    # The first GPU to come free goes to a BK job, though HP work waits (plain priority would
    # give every freed GPU to HP); the next ones to HP, since BP and BK then hold their share.
    first_bk, second_bk = sorted(bk, key=lambda j: j.first_started_at)
    assert all(first_bk.first_started_at < j.first_started_at for j in more_hp)
    assert all(j.first_started_at < second_bk.first_started_at for j in more_hp)
