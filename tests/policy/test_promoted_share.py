"""Promoted jobs' bounded share (issue 39 item 7): within it, a promoted job goes by its age among
its new tier's jobs of its level and keeps its GPUs once it runs; beyond it, it waits behind
the tier's own, as before. Tables over `ordering.pick_next`, `promoted_protects` and the live
boundary's composition (`making_way.makes_way_for`)."""

from __future__ import annotations

import pytest

from clockq.policy import making_way, ordering
from clockq.policy.ordering import Standing, pick_next, promoted_protects, promoted_share_gpus
from clockq.policy.tiers import HP, RT, SP, TIERS

N = len(TIERS)


def job(tier=HP, *, submitted=0.0, job_id=0, promoted=False, level=0, gpus=1) -> Standing:
    return Standing(tier.rank, level, 0.0, submitted, job_id=job_id, promoted=promoted, gpus=gpus)


def heads(own: Standing | None = None, promoted: Standing | None = None) -> list[Standing | None]:
    """A tier's own head and the head of the jobs promoted into it, where the live order puts them."""
    found: list[Standing | None] = [None] * (2 * N)
    if own is not None:
        found[own.rank] = own
    if promoted is not None:
        found[N + promoted.rank] = promoted
    return found


@pytest.mark.parametrize(("total", "share"), [(1, 0), (2, 1), (8, 1), (16, 1), (32, 3), (100, 10)])
def test_the_share_is_a_tenth_and_at_least_one_gpu_on_two_or_more(total, share):
    assert promoted_share_gpus(total) == share


OLD_SP = job(submitted=1.0, job_id=1, promoted=True)  # an SP job promoted to HP, submitted first
NEW_HP = job(submitted=5.0, job_id=5)  # HP's own, submitted after it
OLD_HP = job(submitted=0.5, job_id=0)  # HP's own, submitted before it


@pytest.mark.parametrize(
    ("waiting", "held", "total", "takes"),
    [
        (heads(NEW_HP, OLD_SP), 0, 2, "promoted"),  # within the share: by its age, ahead of newer HP work
        (heads(OLD_HP, OLD_SP), 0, 2, "own"),  # not ahead of HP work older than it
        (heads(NEW_HP, OLD_SP), 1, 2, "own"),  # the share is full: behind the tier's own
        (heads(NEW_HP, OLD_SP), 0, 1, "own"),  # one GPU: no share
        (heads(None, OLD_SP), 1, 2, "promoted"),  # nothing else waits
        (heads(NEW_HP, job(submitted=1.0, job_id=1, promoted=True, gpus=2)), 0, 2, "own"),  # larger than the share
    ],
)
def test_a_free_gpu_takes_a_promoted_job_by_its_age_within_the_share(waiting, held, total, takes):
    best = pick_next(waiting, held_by_lower=0, total_gpus=total, free_gpus=2, held_by_promoted=held)
    assert best == (N + HP.rank if takes == "promoted" else HP.rank)


def test_rt_never_gives_way_to_the_share():
    waiting = heads(None, OLD_SP)
    waiting[RT.rank] = job(RT, submitted=9.0, job_id=9)
    assert pick_next(waiting, held_by_lower=0, total_gpus=2, free_gpus=1, held_by_promoted=0) == RT.rank


@pytest.mark.parametrize(
    ("running", "for_rt", "held", "protected"),
    [
        (job(promoted=True), False, 1, True),  # within the share: HP's next job does not take it back
        (job(promoted=True), True, 1, False),  # RT takes from any share
        (job(promoted=True), False, 2, False),  # beyond the share
        (job(), False, 1, False),  # HP's own job: no share to protect it
    ],
)
def test_a_running_promoted_job_keeps_its_gpu_within_the_share(running, for_rt, held, protected):
    assert promoted_protects(running, for_rt=for_rt, held_by_promoted=held, total_gpus=2) is protected


def test_at_a_boundary_a_new_hp_job_does_not_take_a_running_promoted_jobs_gpu_in_the_share():
    # Two GPUs: an HP job and a promoted SP job run; a new HP job waits.
    running = [job(submitted=0.0, job_id=1), job(submitted=2.0, job_id=2, promoted=True)]
    waiting = heads(job(submitted=9.0, job_id=9))
    for me in (0, 1):
        assert making_way.makes_way_for(me, running, [0.01, 0.01], waiting, total_gpus=2) is None
    # Beyond the share (two promoted jobs on two GPUs), the own tier's job comes first again.
    both = [job(submitted=0.0, job_id=1, promoted=True), job(submitted=2.0, job_id=2, promoted=True)]
    chosen = [making_way.makes_way_for(me, both, [0.01, 0.02], waiting, total_gpus=2) for me in (0, 1)]
    assert chosen == [HP.rank, None]  # the cheaper switch makes way (HP interrupts)


def test_a_job_promoted_into_sp_is_behind_hp_whatever_its_age():
    lifted = job(SP, submitted=0.0, job_id=1, promoted=True)  # a batch chance: BP to SP
    waiting = heads(NEW_HP, lifted)
    assert pick_next(waiting, held_by_lower=0, total_gpus=2, free_gpus=1, held_by_promoted=0) == HP.rank
    assert ordering.order_key_as_own(lifted) > ordering.order_key_as_own(NEW_HP)
