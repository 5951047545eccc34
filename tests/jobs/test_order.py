"""The live order read from the database (clockq/jobs/order.py) against the pure one it feeds."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from clockq.jobs import order
from clockq.jobs.models import Job, QueueTier, UserShare
from clockq.policy import ordering
from clockq.policy.states import JobState
from tests.helpers import submit

pytestmark = pytest.mark.django_db
RT, HP, SP, BP, BK = range(5)
NOW = dt.datetime(2026, 12, 4, tzinfo=dt.UTC)


def queued(owner, code="SP", run_s=0.0, **fields) -> Job:
    job = submit(owner, code, f"{code}-{run_s}")
    Job.objects.filter(pk=job.pk).update(run_ms=int(run_s * 1000), **fields)
    return job


def running(owner, code="SP", run_s=0.0, **fields) -> Job:
    return queued(owner, code, run_s, state=JobState.RUNNING, **fields)


def head_ids() -> list[int | None]:
    return [w.standing.job_id if w else None for w in order.heads()]


def rungs(rank: int) -> tuple[float, ...]:
    return order.ladder().rungs(rank)


def test_the_sql_level_is_the_ladders_level_for_every_tier(alice):
    # Given jobs of every tier at services around each rung of their tier's ladder
    rng = random.Random(4)
    cases = []
    for rank, code in enumerate(("RT", "HP", "SP", "BP", "BK")):
        for rung in (0.0, *rungs(rank)):
            for served in (max(rung - 0.001, 0), rung, rung + rng.uniform(0, 50)):
                cases.append((running(alice, code, served), rank, served))
    # Then the database reads the level the pure ladder gives
    level_of = {r.standing.job_id: r.standing.level for r in order.running()}
    for job, rank, served in cases:
        expected = order.ladder().level(rank, int(served * 1000) / 1000)
        assert level_of[job.pk] == expected, (rank, served)


def test_a_tiers_head_is_its_lowest_level_then_the_smaller_share_then_the_first_submitted(alice, bob):
    served = queued(alice, "SP", run_s=rungs(SP)[0] + 1)  # level 1: sinks below new work
    first = queued(alice, "SP")
    queued(alice, "SP")
    assert head_ids()[SP] == first.pk
    # bob has had no service in SP; alice has: bob's job goes first, though submitted later
    order.add_service(alice.pk, QueueTier.objects.get(code="SP").pk, 1000.0, NOW)
    bobs = queued(bob, "SP")
    assert head_ids()[SP] == bobs.pk
    assert served.pk not in head_ids()


def test_a_promoted_job_keeps_its_service_and_goes_behind_that_tiers_own_jobs_of_its_level(alice):
    hp, sp = QueueTier.objects.get(code="HP"), QueueTier.objects.get(code="SP")
    long_served = rungs(SP)[2] + 5
    promoted = queued(alice, "SP", run_s=long_served, tier=hp, promoted_run_ms=int(long_served * 1000))
    heads = order.heads()
    in_hp = order.head_index(HP, promoted=True)  # the best of the jobs promoted into HP
    assert heads[in_hp].standing.job_id == promoted.pk
    # Its level is its whole service on HP's ladder: a promotion does not make it new
    level = order.ladder().level(HP, long_served)
    assert level > 0
    assert (heads[in_hp].standing.level, heads[in_hp].standing.promoted) == (level, True)
    # HP's own new work goes first; so does HP's own work of the same level (promoted jobs'
    # share aside: on one GPU there is none, ordering.promoted_share_gpus)
    own_new = queued(alice, "HP")
    assert head_ids()[HP] == own_new.pk
    Job.objects.filter(pk=own_new.pk).update(state=JobState.RUNNING)
    own_same_level = queued(alice, "HP", run_s=long_served)
    assert head_ids()[HP] == own_same_level.pk
    assert order.next_for_gpu(total_gpus=1).standing.job_id == own_same_level.pk
    Job.objects.filter(pk=own_same_level.pk).update(state=JobState.RUNNING)
    # ... and it goes ahead of SP's jobs of its level
    queued(alice, "SP", run_s=long_served)
    assert order.next_for_gpu(total_gpus=1).standing.job_id == promoted.pk
    assert sp.pk == Job.objects.get(pk=promoted.pk).original_tier_id


def test_a_batch_chance_counts_the_jobs_level_from_the_lift(alice):
    bp, sp = QueueTier.objects.get(code="BP"), QueueTier.objects.get(code="SP")
    long_served = rungs(BP)[-1] + 5
    lifted = queued(alice, "BP", run_s=long_served, tier=sp, promoted_run_ms=int(long_served * 1000))
    in_sp = order.head_index(SP, promoted=True)
    assert order.heads()[in_sp].standing.level == order.ladder().level(SP, long_served)  # a promotion
    Job.objects.filter(pk=lifted.pk).update(level_from_ms=int(long_served * 1000))  # a batch chance
    assert (order.heads()[in_sp].standing.level, order.heads()[in_sp].standing.promoted) == (0, True)
    assert bp.pk == Job.objects.get(pk=lifted.pk).original_tier_id


def test_a_free_gpu_takes_the_first_job_in_the_order(alice):
    queued(alice, "BK")
    hp = queued(alice, "HP")
    assert order.next_for_gpu(total_gpus=4).standing.job_id == hp.pk
    rt = queued(alice, "RT")
    assert order.next_for_gpu(total_gpus=4).standing.job_id == rt.pk


def test_below_their_share_the_best_effort_tiers_get_a_free_gpu(alice):
    bk = queued(alice, "BK")
    hp = queued(alice, "HP")
    for _ in range(9):
        running(alice, "HP")
    # On 10 GPUs BP and BK hold none of their one-GPU share: the BK job gets the free GPU
    assert order.next_for_gpu(total_gpus=10).standing.job_id == bk.pk
    running(alice, "BK")
    assert order.next_for_gpu(total_gpus=10).standing.job_id == hp.pk


def test_a_running_job_makes_way_only_for_a_job_that_comes_first(alice):
    long_sp = running(alice, "SP", run_s=rungs(SP)[0] + 1)
    queued(alice, "SP", run_s=rungs(SP)[0] + 2)  # same level, later: waits for a free GPU
    assert order.displacing(long_sp.pk) is None
    new_bk = queued(alice, "BK")  # level 0: comes first
    assert order.displacing(long_sp.pk).standing.job_id == new_bk.pk
    assert order.displacing(new_bk.pk) is None  # not running


def test_of_two_running_jobs_the_one_furthest_back_makes_way(alice):
    sp = running(alice, "SP", run_s=rungs(SP)[0] + 1)
    bk = running(alice, "BK", run_s=rungs(BK)[0] + 1)
    hp = queued(alice, "HP")
    assert order.displacing(sp.pk) is None
    assert order.displacing(bk.pk).standing.job_id == hp.pk


def test_service_adds_up_per_user_and_tier_weighted_by_when_it_was_given(alice, bob):
    sp = QueueTier.objects.get(code="SP").pk
    order.add_service(alice.pk, sp, 2000.0, NOW)
    order.add_service(alice.pk, sp, 2000.0, NOW)
    order.add_service(bob.pk, sp, 2000.0, NOW + dt.timedelta(seconds=ordering.FAIR_SHARE_HALF_LIFE_S))
    order.add_service(bob.pk, sp, 0.0, NOW)  # nothing given, nothing written
    shares = dict(UserShare.objects.values_list("user_id", "weighted_gpu_s"))
    # Two seconds now and two now weigh what two seconds one half-life later weigh
    assert shares[alice.pk] == pytest.approx(shares[bob.pk])
    assert UserShare.objects.count() == 2


def test_the_slice_being_ended_counts_in_the_running_jobs_level(alice):
    just_below = running(alice, "SP", run_s=rungs(SP)[0] - 0.005)
    newer = queued(alice, "SP")
    assert order.displacing(just_below.pk) is None  # the same level: first come keeps its GPU
    assert order.displacing(just_below.pk, serving_ms=10).standing.job_id == newer.pk


def test_rt_takes_the_running_job_with_the_cheapest_measured_switch(alice):
    dear = running(alice, "SP", switch_cost_ms=40.0, worker="gpu0@a")
    cheap = running(alice, "BK", switch_cost_ms=4.0, worker="gpu1@a")
    rt = queued(alice, "RT")
    assert order.displacing(dear.pk) is None
    assert order.displacing(cheap.pk).standing.job_id == rt.pk


def test_a_gpu_just_freed_is_free_until_it_runs_a_job_again(alice):
    # Given two busy GPUs and an RT job waiting
    cheap = running(alice, "SP", switch_cost_ms=4.0, worker="gpu0@a")
    running(alice, "SP", switch_cost_ms=40.0, worker="gpu1@a")
    queued(alice, "RT")
    # A third GPU that has just left its job takes the RT job: nobody makes way
    assert order.displacing(cheap.pk, freed={"gpu2@a"}) is None
    # A worker that has left a job and runs one again is not free
    assert order.displacing(cheap.pk, freed={"gpu1@a"}) is not None


def test_a_slice_cut_short_leaves_at_once_only_for_a_tier_that_interrupts(alice):
    bk = running(alice, "BK", run_s=rungs(BK)[0] + 1)
    sp = queued(alice, "SP")
    # Its slice ended early, 10 ms into a planned 100 ms: it has not had its slice
    assert order.displacing(bk.pk, held_s=0.01, slice_s=0.1) is None
    assert order.displacing(bk.pk, held_s=0.2, slice_s=0.1).standing.job_id == sp.pk  # it has
    hp = queued(alice, "HP")
    assert order.displacing(bk.pk, held_s=0.01, slice_s=0.1).standing.job_id == hp.pk  # HP interrupts
