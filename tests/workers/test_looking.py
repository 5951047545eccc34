"""The looks for urgent jobs as a state machine (workers/run/looking.py): each move, pure, with
the clock passed in."""

from __future__ import annotations

from clockq.bus.free_gpus import FREE_S
from workers.run.looking import MAX_PASSED_OVER, UNRESPONSIVE_S, Looking, UrgentLooks

ME, OTHER, THIRD = 1, 2, 3


def test_a_look_that_names_another_gpus_job_awaits_it_for_unresponsive_s():
    looks = UrgentLooks().other_named(OTHER, me=ME, now=10.0, gpu_freed=False, relook=False)
    assert looks.state == Looking.AWAITING_VICTIM
    assert looks.awaited == (OTHER, 10.0)
    assert not looks.relook_due(10.0 + UNRESPONSIVE_S / 2)
    assert looks.relook_due(10.0 + UNRESPONSIVE_S)


def test_the_same_victim_named_again_counts_from_when_it_was_first_named():
    looks = UrgentLooks().other_named(OTHER, me=ME, now=10.0, gpu_freed=False, relook=False)
    looks = looks.other_named(OTHER, me=ME, now=10.1, gpu_freed=False, relook=False)
    assert looks.awaited == (OTHER, 10.0)
    assert looks.relook_at == 10.0 + UNRESPONSIVE_S


def test_a_victim_that_has_not_made_way_in_time_is_overdue_and_passed_over():
    looks = UrgentLooks().other_named(OTHER, me=ME, now=10.0, gpu_freed=False, relook=False)
    assert not looks.overdue(OTHER, now=10.0 + UNRESPONSIVE_S / 2)
    assert not looks.overdue(THIRD, now=10.0 + UNRESPONSIVE_S)  # another job named: not that one's wait
    assert looks.overdue(OTHER, now=10.0 + UNRESPONSIVE_S)
    assert looks.pass_over(OTHER).passed_over == {OTHER}


def test_no_more_than_max_passed_over_jobs_are_passed_over_or_awaited():
    looks = UrgentLooks()
    for victim in range(10, 10 + MAX_PASSED_OVER):
        looks = looks.pass_over(victim)
    named = looks.other_named(OTHER, me=ME, now=10.0, gpu_freed=False, relook=False)
    assert named.state == Looking.CALM and named.awaited is None and named.relook_at is None
    assert not named.overdue(OTHER, now=99.0)


def test_a_look_while_a_gpu_counts_as_free_looks_once_more_when_it_no_longer_counts():
    looks = UrgentLooks().other_named(None, me=ME, now=10.0, gpu_freed=True, relook=False)
    assert looks.state == Looking.AWAITING_FREE_GPU
    assert looks.relook_at == 10.0 + FREE_S
    # A second announcement before then does not push the look back.
    again = looks.other_named(None, me=ME, now=10.2, gpu_freed=True, relook=False)
    assert again.relook_at == 10.0 + FREE_S


def test_the_look_once_more_never_arms_another_so_a_gpu_looks_at_most_twice_per_announcement():
    looks = UrgentLooks().other_named(None, me=ME, now=10.0, gpu_freed=True, relook=False)
    assert looks.relook_due(10.0 + FREE_S)
    relooking = looks.relooking()
    assert not relooking.relook_due(99.0)
    after = relooking.other_named(None, me=ME, now=10.0 + FREE_S, gpu_freed=True, relook=True)
    assert after.state == Looking.CALM and after.relook_at is None


def test_a_look_that_names_this_job_makes_way_and_is_calm_once_the_boundary_decided():
    awaiting = UrgentLooks().other_named(OTHER, me=ME, now=10.0, gpu_freed=False, relook=False)
    making_way = awaiting.pass_over(OTHER).this_named()
    assert making_way.state == Looking.MAKING_WAY
    assert making_way.relook_at is None and making_way.awaited is None
    done = making_way.made_way()
    assert done.state == Looking.CALM
    assert done.passed_over == {OTHER}  # until nothing waits any more


def test_when_nothing_waits_any_more_all_is_calm_and_the_jobs_passed_over_count_again():
    looks = UrgentLooks().pass_over(OTHER).other_named(THIRD, me=ME, now=10.0, gpu_freed=True, relook=False)
    assert looks.nothing_waits() == UrgentLooks()


def test_a_look_that_names_this_job_when_it_is_not_yet_to_leave_awaits_nothing():
    looks = UrgentLooks().other_named(ME, me=ME, now=10.0, gpu_freed=False, relook=False)
    assert looks.state == Looking.CALM and looks.awaited is None
