"""The promotion tick, batch chances and promotion by hand, against the real database: what the
tick counts from Slice rows and running jobs, and what a promotion writes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from clockq.jobs.models import Job, QueueTier, Slice
from clockq.jobs.promotion import PromotionRefused, give_batch_chance, promote_job, promotion_tick
from clockq.jobs.transitions import transition
from clockq.policy.states import JobState
from tests.helpers import submit

pytestmark = pytest.mark.django_db


def started_slice(job, at):
    Slice.objects.create(
        job=job, worker="gpu0@test", gpu_index=0, started_at=at, ended_at=at + timedelta(milliseconds=50),
        planned_ms=50, used_ms=50, outcome="yielded",
    )  # fmt: skip


def waiting_since(job, at):
    Job.objects.filter(pk=job.pk).update(enqueued_at=at, submitted_at=at)


class Ticks:
    """Promotion ticks 10 s apart, with a slice of `busy` started inside each round."""

    def __init__(self, busy):
        self.busy = busy
        self.now = timezone.now() - timedelta(minutes=10)
        promotion_tick(now=self.now)  # starts the clock

    def round(self, slices=True):
        if slices:
            started_slice(self.busy, self.now + timedelta(seconds=1))
        self.now += timedelta(seconds=10)
        return promotion_tick(now=self.now)


def test_an_sp_job_skipped_three_rounds_is_promoted_to_hp_for_one_slice(alice):
    busy = submit(alice, "HP", "hp-work")
    starved = submit(alice, "SP", "starved")
    ticks = Ticks(busy)
    since = ticks.now - timedelta(seconds=1)
    waiting_since(starved, since)
    old_token = starved.dispatch_token

    assert ticks.round().skips == {starved.pk: 1}
    assert ticks.round(slices=False).is_round is False  # an idle tick neither counts nor breaks
    assert ticks.round().skips == {starved.pk: 2}
    assert Job.objects.get(pk=starved.pk).skipped_rounds == 2
    decisions = ticks.round()

    assert [p.job_id for p in decisions.promotions] == [starved.pk]
    job = Job.objects.get(pk=starved.pk)
    assert (job.tier.code, job.original_tier.code, job.state) == ("HP", "SP", "queued")
    assert job.dispatch_token != old_token  # its SP message is stale now
    assert job.enqueued_at == since  # it keeps its wait
    assert job.skipped_rounds == 0
    assert job.level_from_ms == 0  # its level counts all its service
    assert job.events.last().reason.startswith("promoted SP -> HP: skipped in 3 consecutive rounds")


def test_a_slice_of_its_own_resets_the_streak(alice):
    busy = submit(alice, "HP", "hp-work")
    job = submit(alice, "SP", "sp")
    ticks = Ticks(busy)
    waiting_since(job, ticks.now - timedelta(seconds=1))
    ticks.round()
    ticks.round()
    assert Job.objects.get(pk=job.pk).skipped_rounds == 2

    # It runs a slice (the claim resets the streak) and comes back to the queue.
    j = Job.objects.get(pk=job.pk)
    transition(j.pk, to=JobState.RUNNING, expect={JobState.QUEUED}, token=j.dispatch_token, reason="t", actor="t")
    j = Job.objects.get(pk=job.pk)
    assert j.skipped_rounds == 0
    transition(j.pk, to=JobState.QUEUED, expect={JobState.RUNNING}, token=j.dispatch_token, reason="t", actor="t",
               updates={"enqueued_at": ticks.now + timedelta(seconds=2)})  # fmt: skip

    assert ticks.round().skips == {}  # it entered the queue during this round
    assert ticks.round().skips == {job.pk: 1}
    assert ticks.round().skips == {job.pk: 2}
    assert ticks.round().promotions[0].job_id == job.pk


def test_tiers_without_promotion_are_left_alone(alice):
    busy = submit(alice, "RT", "rt-work")
    jobs = [submit(alice, tier, tier) for tier in ("HP", "BP", "BK")]
    ticks = Ticks(busy)
    for job in jobs:
        waiting_since(job, ticks.now - timedelta(seconds=1))
    for _ in range(5):
        assert ticks.round().promotions == []
    assert set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("skipped_rounds", flat=True)) == {0}


def test_a_tier_rule_edited_in_the_admin_applies_at_the_next_tick(alice):
    busy = submit(alice, "HP", "hp-work")
    job = submit(alice, "BP", "bp")
    QueueTier.objects.filter(code="BP").update(promote_after_rounds=1, promote_to=QueueTier.objects.get(code="SP"))
    ticks = Ticks(busy)
    waiting_since(job, ticks.now - timedelta(seconds=1))
    assert [p.to_tier for p in ticks.round().promotions] == ["SP"]


def test_batch_chance_lifts_the_oldest_waiting_bp_job_through_sp(alice):
    newer, older, oldest = (submit(alice, "BP", name) for name in ("newer", "older", "oldest"))
    now = timezone.now()
    for job, age in ((newer, 1), (older, 2), (oldest, 3)):
        Job.objects.filter(pk=job.pk).update(enqueued_at=now - timedelta(hours=age), run_ms=age * 1000)

    assert give_batch_chance("BP") == 1
    lifted = Job.objects.get(pk=oldest.pk)
    assert (lifted.tier.code, lifted.original_tier.code) == ("SP", "BP")
    assert lifted.level_from_ms == lifted.run_ms == 3000  # a chance to be scheduled: its level counts from here
    assert lifted.events.last().reason.startswith("batch chance: lifted to SP")
    assert give_batch_chance("BP") == 1  # the next one; the lifted one is no longer waiting in BP
    assert Job.objects.get(pk=older.pk).tier.code == "SP"

    QueueTier.objects.filter(code="BP").update(chance_jobs=0)
    assert give_batch_chance("BP") == 0
    assert give_batch_chance("NOPE") == 0


def test_promotion_by_hand(alice, carol):
    job = submit(alice, "SP", "by-hand")
    promoted = promote_job(job, actor="carol")
    assert (promoted.tier.code, promoted.original_tier.code) == ("HP", "SP")
    assert promoted.events.last().actor == "carol"
    with pytest.raises(PromotionRefused, match="already promoted"):
        promote_job(promoted, actor="carol")

    bp = submit(alice, "BP", "to-rt")
    assert promote_job(bp, actor="carol", to_tier_code="RT").tier.code == "RT"
    with pytest.raises(PromotionRefused, match="not more urgent"):
        promote_job(submit(alice, "SP", "down"), actor="carol", to_tier_code="BK")
    with pytest.raises(PromotionRefused, match="unknown tier"):
        promote_job(submit(alice, "SP", "x"), actor="carol", to_tier_code="ZZ")
    with pytest.raises(PromotionRefused, match="most urgent"):
        promote_job(submit(alice, "RT", "rt"), actor="carol")
    # A tier without promote_to goes up one rank.
    assert promote_job(submit(alice, "BK", "bk"), actor="carol").tier.code == "BP"
    held = submit(alice, "SP", "held")
    Job.objects.filter(pk=held.pk).update(state="held")
    with pytest.raises(PromotionRefused, match="only a waiting job"):
        promote_job(held, actor="carol")


def test_a_promoted_job_that_leaves_the_queue_without_its_slice_goes_home(alice, carol):
    from clockq.jobs.services import cancel_job, hold_job, release_job, requeue_job

    job = promote_job(submit(alice, "SP", "leaves"), actor="carol")
    Job.objects.filter(pk=job.pk).update(level_from_ms=500)  # as after a batch chance
    held = hold_job(job, actor="carol")
    assert (held.state, held.tier.code, held.level_from_ms) == ("held", "SP", 0)
    assert release_job(held, actor="carol").tier.code == "SP"

    job = promote_job(Job.objects.get(pk=job.pk), actor="carol")
    cancelled = cancel_job(job, actor="carol")
    assert cancelled.tier.code == "SP"
    assert requeue_job(cancelled, actor="carol").tier.code == "SP"
