"""The scheduling order, as tables: the service ladder, the order key, making way, and the share."""

from __future__ import annotations

import math

import pytest

from clockq.policy import making_way, ordering
from clockq.policy.ordering import (
    DEFAULT_LADDER,
    Ladder,
    Standing,
    interrupts,
    leaves_at,
    may_backfill,
    may_displace,
    order_key,
    outranks,
    pick_next,
    pick_victim,
    share_protects,
    share_weight,
    victim_key,
)

RT, HP, SP, BP, BK = range(5)
TOTAL = 100
# The fewest best-effort GPUs that still hold the share, and one more.
AT_SHARE = ordering.lower_share_gpus(TOTAL)
ABOVE_SHARE = AT_SHARE + 1


def job(rank=SP, level=0, share=0.0, submitted=0.0, job_id=0, promoted=False, gpus=1):
    return Standing(rank, level, share, submitted, job_id=job_id, promoted=promoted, gpus=gpus)


# --- the service ladder ------------------------------------------------------------------------


def test_a_level_counts_the_rungs_the_service_has_passed():
    rungs = DEFAULT_LADDER.rungs(BK)
    assert DEFAULT_LADDER.level(BK, 0.0) == 0
    assert DEFAULT_LADDER.level(BK, rungs[0] * 0.99) == 0
    assert DEFAULT_LADDER.level(BK, rungs[0]) == 1
    assert DEFAULT_LADDER.level(BK, rungs[1]) == 2
    assert DEFAULT_LADDER.level(BK, rungs[-1] * 10) == len(rungs)


def test_a_more_urgent_tier_has_a_longer_ladder():
    ladder = DEFAULT_LADDER
    for rank in range(ladder.tiers):
        weight = ladder.weight_per_rank ** (ladder.tiers - 1 - rank)
        assert ladder.rungs(rank) == pytest.approx([r * weight for r in ladder.base_gpu_s])
    firsts = [ladder.rungs(rank)[0] for rank in range(ladder.tiers)]
    assert firsts == sorted(firsts, reverse=True) and len(set(firsts)) == ladder.tiers
    assert ladder.rungs(BK) == tuple(ladder.base_gpu_s)


def test_a_service_that_drops_a_bk_job_a_level_leaves_an_rt_job_where_it_was():
    service = DEFAULT_LADDER.rungs(BK)[0]
    assert DEFAULT_LADDER.level(BK, service) == 1
    assert DEFAULT_LADDER.level(RT, service) == 0


def test_next_rung_is_where_the_job_drops_a_level_and_none_on_the_last():
    rungs = DEFAULT_LADDER.rungs(HP)
    assert DEFAULT_LADDER.next_rung(HP, 0.0) == rungs[0]
    assert DEFAULT_LADDER.next_rung(HP, rungs[0]) == rungs[1]
    assert DEFAULT_LADDER.next_rung(HP, rungs[-1]) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_gpu_s": ()}, "rungs must be finite, positive and strictly increasing"),
        ({"base_gpu_s": (2_400.0, 300.0)}, "rungs must be finite, positive and strictly increasing"),
        ({"base_gpu_s": (300.0, 300.0)}, "rungs must be finite, positive and strictly increasing"),
        ({"base_gpu_s": (0.0, 300.0)}, "rungs must be finite, positive and strictly increasing"),
        ({"base_gpu_s": (-1.0, 300.0)}, "rungs must be finite, positive and strictly increasing"),
        ({"base_gpu_s": (math.nan, 300.0)}, "rungs must be finite, positive and strictly increasing"),
        ({"weight_per_rank": 0.5}, "weight per rank must be a number >= 1"),
        ({"weight_per_rank": math.inf}, "weight per rank must be a number >= 1"),
        ({"weight_per_rank": math.nan}, "weight per rank must be a number >= 1"),
    ],
)
def test_an_invalid_ladder_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Ladder(**kwargs)


def test_a_promoted_job_keeps_its_promotion_for_the_first_rung_of_its_new_tier():
    for rank in (RT, HP, SP):
        assert DEFAULT_LADDER.promotion_service(rank) == DEFAULT_LADDER.rungs(rank)[0]
    assert DEFAULT_LADDER.promotion_service(HP) > DEFAULT_LADDER.promotion_service(SP)


# --- the order ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (job(BK, level=0), job(RT, level=1)),  # level first: a long RT job sinks below new work
        (job(RT), job(BK)),  # a new urgent job starts first
        (job(HP), job(SP)),  # same level: the more urgent tier
        (job(HP, submitted=9.0), job(HP, promoted=True)),  # own tier before promoted, however new
        (job(HP, promoted=True), job(SP)),  # a promoted job goes ahead of its own tier
        (job(HP, level=0, promoted=True), job(HP, level=1)),  # and of the tier's long-served jobs
        (job(SP, share=1.0, submitted=9.0), job(SP, share=5.0)),  # fair share before submit time
        (job(SP, share=1.0, submitted=1.0), job(SP, share=1.0, submitted=2.0)),  # then the older
        (job(SP, job_id=1), job(SP, job_id=2)),  # then the id, so the order is total
    ],
)
def test_the_order_puts_the_first_job_ahead(first, second):
    assert order_key(first) < order_key(second)
    assert sorted([second, first], key=order_key) == [first, second]


def test_a_long_served_rt_job_sinks_below_a_new_bk_job():
    served = DEFAULT_LADDER.level(RT, DEFAULT_LADDER.rungs(RT)[-1])
    assert order_key(job(BK, level=DEFAULT_LADDER.level(BK, 0.0))) < order_key(job(RT, level=served))


def test_a_job_that_yields_keeps_its_place_ahead_of_newer_jobs():
    # alice was first submitted at t=100, bob at t=200; alice yields at t=300 and re-enters
    # with her first submit time, not the time she yielded.
    alice, bob = job(SP, submitted=100.0, job_id=2), job(SP, submitted=200.0, job_id=1)
    assert min([bob, alice], key=order_key) is alice


# --- making way --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("waiting", "running", "displaces"),
    [
        (job(SP, submitted=0.0), job(SP, submitted=9.0), False),  # same class: first come keeps it
        (job(SP, share=0.0), job(SP, share=1e9), False),  # the user share does not count
        (job(HP), job(SP), True),  # a more urgent tier
        (job(SP), job(HP), False),
        (job(BK, level=0), job(RT, level=2), True),  # a better level, across tiers
        (job(RT, level=1), job(BK, level=0), False),
        (job(HP), job(HP, promoted=True), True),  # own tier's job against a promoted one
        (job(HP, promoted=True), job(HP), False),
        (job(RT, level=0), job(RT, level=3), False),  # RT never displaces RT
    ],
)
def test_may_displace(waiting, running, displaces):
    assert may_displace(waiting, running) is displaces


def test_rt_outranks_a_long_served_rt_job_but_does_not_displace_it():
    assert outranks(job(RT, level=0), job(RT, level=3)) and not may_displace(job(RT, level=0), job(RT, level=3))


@pytest.mark.parametrize(("rank", "interrupt"), [(RT, True), (HP, True), (SP, False), (BP, False), (BK, False)])
def test_only_the_urgent_tiers_interrupt(rank, interrupt):
    assert interrupts(rank) is interrupt


@pytest.mark.parametrize(
    ("now", "interrupt", "leaves"),
    [
        (105.0, True, 105.0),  # an interrupt ends the slice at once
        (105.0, False, 130.0),  # otherwise once it has had its slice
        (140.0, False, 140.0),  # and at once if it has
    ],
)
def test_a_victim_leaves_at_once_or_after_its_slice(now, interrupt, leaves):
    assert leaves_at(now=now, got_gpus_at=100.0, slice_s=30.0, interrupt=interrupt) == leaves


def victim(waiting, running, held_by_lower=TOTAL):
    """The job pick_victim names among (standing, switch cost) pairs, fed in victim_key order;
    by default the best-effort tiers hold far more than their share."""
    by_cost = interrupts(waiting.rank)
    ordered = [s for s, _ in sorted(running, key=lambda r: victim_key(r[0], r[1], by_cost=by_cost))]
    pick = pick_victim(waiting, ordered, held_by_lower=held_by_lower, total_gpus=TOTAL)
    return None if pick is None else ordered[pick]


def test_rt_takes_the_cheapest_switch_first():
    cheap, dear = job(SP, job_id=1), job(BK, level=2, job_id=2)
    assert victim(job(RT), [(dear, 30.0), (cheap, 5.0)]) is cheap


def test_rt_passes_over_rt_jobs_to_a_cheaper_non_rt_one_behind_them():
    other_rt, hp = job(RT, level=1, job_id=1), job(HP, level=1, job_id=2)
    assert victim(job(RT), [(other_rt, 1.0), (hp, 10.0)]) is hp
    assert victim(job(RT), [(other_rt, 1.0)]) is None


def test_hp_takes_the_cheapest_switch_among_the_jobs_it_may_displace():
    cheap_sp, dear_bk = job(SP, job_id=1), job(BK, level=2, job_id=2)
    assert victim(job(HP), [(dear_bk, 30.0), (cheap_sp, 5.0)]) is cheap_sp
    # HP's own new work is passed over, however cheap
    assert victim(job(HP), [(job(HP, job_id=3), 1.0), (dear_bk, 30.0)]) is dear_bk


def test_an_urgent_walk_passes_over_what_it_may_not_displace():
    # RT at level 1 may not take the cheap HP job at level 0, but may take the BK job behind it
    bk = job(BK, level=2)
    assert victim(job(RT, level=1), [(job(HP, level=0), 1.0), (bk, 9.0)]) is bk
    assert victim(job(RT, level=1), [(job(HP, level=0), 1.0)]) is None


def test_others_take_the_job_furthest_back_in_the_order_first():
    far_back = job(BK, level=1, job_id=3)
    running = [(job(BP, job_id=1), 1.0), (job(BK, job_id=2), 5.0), (far_back, 100.0)]
    assert victim(job(SP), running) is far_back


def test_among_equals_the_cheapest_switch_makes_way():
    cheap = job(BK, job_id=2)
    assert victim(job(SP), [(job(BK, job_id=1), 20.0), (cheap, 5.0)]) is cheap


def test_the_walk_stops_at_the_first_job_that_may_not_be_displaced():
    # Furthest back first: the first job BP may not displace is better placed than all behind it
    assert victim(job(BP), [(job(SP), 1.0), (job(HP), 2.0)]) is None
    assert victim(job(SP), [(job(HP), 1.0), (job(RT), 2.0)]) is None
    assert victim(job(SP), []) is None

    def candidates():
        yield job(HP)
        raise AssertionError("read past a job it may not displace")

    assert pick_victim(job(SP), candidates(), held_by_lower=ABOVE_SHARE, total_gpus=TOTAL) is None


def test_the_walk_reads_no_further_than_the_job_it_names():
    def candidates():
        yield job(BK)
        raise AssertionError("read past the victim")

    assert pick_victim(job(HP), candidates(), held_by_lower=ABOVE_SHARE, total_gpus=TOTAL) == 0


def test_the_share_keeps_a_best_effort_job_from_hp_but_not_from_rt():
    bk, sp = job(BK, job_id=1), job(SP, job_id=2)
    assert victim(job(HP), [(bk, 1.0), (sp, 9.0)], held_by_lower=AT_SHARE) is sp
    assert victim(job(HP), [(bk, 1.0), (sp, 9.0)], held_by_lower=ABOVE_SHARE) is bk
    assert victim(job(RT), [(bk, 1.0)], held_by_lower=AT_SHARE) is bk


@pytest.mark.parametrize(
    ("running", "for_rt", "held", "protects"),
    [
        (job(BK), False, AT_SHARE, True),  # taking it would put the share below its bound
        (job(BP), False, AT_SHARE, True),
        (job(BK), False, ABOVE_SHARE, False),  # the share holds without it
        (job(BK), True, AT_SHARE, False),  # RT takes from the share
        (job(SP), False, 0, False),  # only best-effort jobs are protected
        (job(BK, gpus=4), False, AT_SHARE + 3, True),  # a gang counts all its GPUs
        (job(BK, gpus=4), False, AT_SHARE + 4, False),
    ],
)
def test_share_protects(running, for_rt, held, protects):
    assert share_protects(running, for_rt=for_rt, held_by_lower=held, total_gpus=TOTAL) is protects


# --- the next job and backfill -----------------------------------------------------------------


def test_nothing_waiting_picks_nothing():
    assert pick_next([], held_by_lower=0, total_gpus=TOTAL, free_gpus=1) is None
    assert pick_next([None] * 5, held_by_lower=0, total_gpus=TOTAL, free_gpus=1) is None


def test_the_first_head_in_the_order_goes_first_while_the_share_is_held():
    heads = [None, job(HP, level=1), job(SP, level=0), None, job(BK, level=0)]
    assert pick_next(heads, held_by_lower=AT_SHARE, total_gpus=TOTAL, free_gpus=1) == SP


def test_below_the_share_the_best_fitting_best_effort_head_goes_first():
    heads = [None, job(HP), job(SP), job(BP, level=2), job(BK, level=1)]
    assert pick_next(heads, held_by_lower=0, total_gpus=TOTAL, free_gpus=1) == BK


def test_rt_never_gives_way_to_the_share():
    heads = [job(RT), None, None, None, job(BK)]
    assert pick_next(heads, held_by_lower=0, total_gpus=TOTAL, free_gpus=1) == RT


def test_the_share_takes_no_best_effort_head_that_does_not_fit():
    heads = [None, job(HP), None, None, job(BK, gpus=4)]
    assert pick_next(heads, held_by_lower=0, total_gpus=TOTAL, free_gpus=2) == HP
    assert pick_next(heads, held_by_lower=0, total_gpus=TOTAL, free_gpus=4) == BK


@pytest.mark.parametrize(
    ("candidate", "gathering", "backfills"),
    [
        (job(BK), False, True),  # it would make way for the head
        (job(BK), True, False),  # the freed GPUs are the head's
        (job(SP, submitted=9.0), False, False),  # same class: it would keep its GPUs
        (job(HP), False, False),  # better placed than the head
    ],
)
def test_may_backfill(candidate, gathering, backfills):
    head = job(SP, gpus=8)
    assert may_backfill(head, candidate, head_gathering=gathering) is backfills


# --- fair-share decay --------------------------------------------------------------------------


def test_a_gain_one_half_life_later_counts_double():
    half_life = ordering.FAIR_SHARE_HALF_LIFE_S
    assert share_weight(0.0) == 1.0
    assert share_weight(half_life) == pytest.approx(2.0)
    assert share_weight(5 * half_life) / share_weight(4 * half_life) == pytest.approx(2.0)
    assert share_weight(10.0, half_life_s=10.0) == pytest.approx(2.0)


def test_weighted_shares_compare_as_decayed_ones_would_at_any_time():
    half_life = ordering.FAIR_SHARE_HALF_LIFE_S
    gains = {"alice": [(0.0, 100.0)], "bob": [(half_life, 60.0)], "carol": [(0.0, 30.0), (2 * half_life, 90.0)]}
    weighted = {user: sum(g * share_weight(t) for t, g in gs) for user, gs in gains.items()}
    for now in (2 * half_life, 3 * half_life, 10 * half_life):
        decayed = {user: sum(g * 0.5 ** ((now - t) / half_life) for t, g in gs) for user, gs in gains.items()}
        assert sorted(gains, key=weighted.get) == sorted(gains, key=decayed.get)
        for user in gains:
            assert weighted[user] == pytest.approx(decayed[user] * share_weight(now))


def test_the_share_is_whole_gpus_and_none_on_a_small_cluster():
    assert ordering.lower_share_gpus(TOTAL) == math.floor(ordering.LOWER_TIER_SHARE * TOTAL)
    tiny = math.ceil(1 / ordering.LOWER_TIER_SHARE) - 1  # too small for the share to be a GPU
    assert ordering.lower_share_gpus(tiny) == 0
    assert not share_protects(job(BK), for_rt=False, held_by_lower=1, total_gpus=tiny)
    heads = [None, job(HP), None, None, job(BK)]
    assert pick_next(heads, held_by_lower=0, total_gpus=tiny, free_gpus=1) == HP


# --- making way at a live boundary -------------------------------------------------------------


def boundary(me, running, heads, costs=None, total=None):
    costs = costs if costs is not None else [0.01] * len(running)
    total = total if total is not None else len(running)  # every GPU busy
    return making_way.makes_way_for(me, running, costs, heads, total_gpus=total)


def test_a_job_goes_on_when_nothing_waiting_comes_first():
    running = [job(SP, level=0, job_id=1)]
    assert boundary(0, running, [None, None, job(SP, level=0, submitted=5, job_id=2), None, None]) is None
    assert boundary(0, running, [None] * 5) is None


def test_a_job_makes_way_for_a_waiting_job_of_a_better_level():
    running = [job(SP, level=1, job_id=1)]
    assert boundary(0, running, [None, None, None, None, job(BK, level=0, job_id=2)]) == BK


def test_only_the_victim_makes_way_and_the_others_go_on():
    # Two GPUs, both displaceable: the one furthest back in the order (BK at level 1) makes way.
    running = [job(SP, level=1, job_id=1), job(BK, level=1, job_id=2)]
    heads = [None, job(HP, level=0, job_id=3), None, None, None]
    assert boundary(0, running, heads) is None
    assert boundary(1, running, heads) == HP


def test_for_rt_the_cheapest_switch_makes_way():
    running = [job(SP, level=0, job_id=1), job(BK, level=0, job_id=2)]
    heads = [job(RT, job_id=3), None, None, None, None]
    assert boundary(0, running, heads, costs=[0.01, 0.5]) == RT
    assert boundary(1, running, heads, costs=[0.01, 0.5]) is None


def test_nobody_makes_way_while_a_gpu_is_free():
    # One of two GPUs was just given up (its job yielded): the waiting job takes that one
    running = [job(SP, level=3, job_id=1)]
    assert boundary(0, running, [None, job(HP, job_id=2), None, None, None], total=2) is None


def test_the_share_keeps_the_last_best_effort_gpu_from_hp():
    # On 10 GPUs the best-effort tiers' share is one GPU: its job keeps it against HP.
    running = [job(BK, level=2, job_id=1)] + [job(HP, level=0, job_id=i) for i in range(2, 11)]
    heads = [None, job(HP, level=0, job_id=20), None, None, None]
    assert boundary(0, running, heads, total=10) is None
