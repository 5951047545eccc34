"""The starvation rules, as tables: rounds, skips, promotion, batch chances, and tier links."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from clockq.policy.promotion import (
    RoundFacts,
    TierLinks,
    TierRule,
    WaitingJob,
    batch_chance,
    decide_round,
    promotion_problems,
)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)  # the round's start (the previous tick)
BEFORE = T0 - timedelta(seconds=5)
DURING = T0 + timedelta(seconds=5)
RULES = {
    "RT": TierRule("RT", None, None),
    "HP": TierRule("HP", None, None),
    "SP": TierRule("SP", 3, "HP"),
    "BP": TierRule("BP", None, None),
}


def job(id, tier="SP", skipped=0, since=BEFORE, home=None):
    return WaitingJob(id, tier, home or tier, skipped, since)


def facts(slices=1, started=()):
    return RoundFacts(started_at=T0, slices_started=slices, jobs_that_started=frozenset(started))


@pytest.mark.parametrize(
    ("case", "facts", "waiting", "skips", "promoted"),
    [
        ("a slice went elsewhere: counted", facts(1, {99}), [job(1)], {1: 1}, []),
        ("second round", facts(4, {99}), [job(1, skipped=1)], {1: 2}, []),
        ("third round: promoted", facts(2, {99}), [job(1, skipped=2)], {}, [1]),
        ("past the count (rule lowered): promoted", facts(1), [job(1, skipped=7)], {}, [1]),
        ("no slice started: not a round, nothing counts", facts(0), [job(1, skipped=2)], {}, []),
        ("its own slice: not skipped", facts(3, {1}), [job(1, skipped=2)], {}, []),
        ("entered the queue during the round: not skipped", facts(1, {99}), [job(1, since=DURING)], {}, []),
        ("already promoted: waits for its slice", facts(1), [job(1, tier="HP", home="SP", skipped=0)], {}, []),
        ("tier without a rule counts skips but never promotes", facts(1), [job(2, tier="BP", skipped=50)], {2: 51}, []),
        (
            "each job on its own",
            facts(2, {3}),
            [job(1, skipped=2), job(2), job(3, skipped=2)],
            {2: 1},
            [1],
        ),
    ],
)
def test_round(case, facts, waiting, skips, promoted):
    decisions = decide_round(facts, waiting, RULES)
    assert decisions.is_round == (facts.slices_started > 0), case
    assert decisions.skips == skips, case
    assert [p.job_id for p in decisions.promotions] == promoted, case
    for p in decisions.promotions:
        assert (p.from_tier, p.to_tier) == ("SP", "HP")
        assert "3 consecutive rounds" in p.reason or "8 consecutive rounds" in p.reason
        assert p.reason.endswith("in the last round")
        assert not p.fresh_level  # a promotion keeps the job's service


def test_only_consecutive_rounds_count():
    """A slice of its own resets the streak: the worker's claim writes skipped_rounds=0, so
    the next round counts from 1 again."""
    streak = 0
    for ran in (False, False, True, False, False):
        if ran:
            streak = 0  # what a claim does
            continue
        decisions = decide_round(facts(1, {99}), [job(1, skipped=streak)], RULES)
        streak = decisions.skips[1]
    assert streak == 2  # two rounds since its slice: not yet promoted


def test_a_tick_without_slices_neither_counts_nor_breaks_a_streak():
    assert decide_round(facts(0), [job(1, skipped=2)], RULES).skips == {}
    assert [p.job_id for p in decide_round(facts(1), [job(1, skipped=2)], RULES).promotions] == [1]


@pytest.mark.parametrize(
    ("jobs", "to", "waiting", "chosen"),
    [
        (1, "SP", [job(5, "BP"), job(6, "BP")], [5]),
        (2, "SP", [job(5, "BP"), job(6, "BP"), job(7, "BP")], [5, 6]),
        (0, "SP", [job(5, "BP")], []),
        (1, None, [job(5, "BP")], []),
        (1, "SP", [], []),
        (1, "SP", [job(5, tier="SP", home="BP"), job(6, "BP")], [6]),  # 5 is already lifted
        (1, "SP", [job(8, "SP"), job(6, "BP")], [6]),  # other tiers' jobs are not its business
    ],
)
def test_batch_chance(jobs, to, waiting, chosen):
    picked = batch_chance(waiting, tier="BP", jobs=jobs, to_tier=to)
    assert [p.job_id for p in picked] == chosen
    assert all(p.to_tier == to and p.reason.startswith("batch chance") for p in picked)
    assert all(p.fresh_level for p in picked)  # a chance to be scheduled, whatever it has run


DEFAULT_LINKS = {
    "RT": TierLinks(0, None, None),
    "HP": TierLinks(1, None, None),
    "SP": TierLinks(2, "HP", None),
    "BP": TierLinks(3, None, "SP"),
    "BK": TierLinks(4, None, None),
}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({}, None),
        ({"HP": TierLinks(1, "SP", None)}, "HP -> SP: jobs may only be lifted to a more urgent tier"),
        ({"HP": TierLinks(1, "SP", None)}, "would loop"),
        ({"SP": TierLinks(2, "SP", None)}, "cannot be lifted to itself"),
        ({"SP": TierLinks(2, "XX", None)}, "unknown tier 'XX'"),
        ({"BP": TierLinks(3, None, "BK")}, "BP -> BK"),
        # A rank change that turns an existing link downwards is caught too.
        ({"HP": TierLinks(5, None, None)}, "SP -> HP"),
        ({"BK": TierLinks(4, "RT", "BP")}, None),
    ],
)
def test_tier_links(change, problem):
    found = promotion_problems({**DEFAULT_LINKS, **change})
    if problem is None:
        assert found == []
    else:
        assert any(problem in p.message for p in found), found
