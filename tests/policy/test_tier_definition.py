"""The one definition of the tiers: well formed, and the judge of the rows that copy it."""

from __future__ import annotations

import pytest

from clockq.policy.promotion import TierLinks, promotion_problems
from clockq.policy.tiers import QUEUES_IN_ORDER, TIER_CODES, TIERS, UnknownTier, row_problems, tier

AGREEING = [t.code for t in TIERS]


def test_the_tiers_are_ranked_in_their_order_each_on_a_queue_of_its_own():
    assert TIER_CODES == ("RT", "HP", "SP", "BP", "BK")
    assert [t.rank for t in TIERS] == list(range(len(TIERS)))
    assert QUEUES_IN_ORDER == ("rt", "hp", "sp", "bp", "bk")
    assert len(set(QUEUES_IN_ORDER)) == len(TIERS)


def test_the_promotion_links_point_to_more_urgent_defined_tiers():
    links = {t.code: TierLinks(t.rank, t.promote_to, t.chance_to) for t in TIERS}
    assert promotion_problems(links) == []


def test_a_code_that_is_not_a_tier_is_refused_naming_the_tiers():
    assert tier("SP").use == "standard training"
    for code in ("XX", "sp", None, ["SP"]):
        with pytest.raises(UnknownTier, match=r"the tiers are RT, HP, SP, BP, BK"):
            tier(code)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rows", "problems"),
    [
        (AGREEING, []),
        (list(reversed(AGREEING)), []),  # the order of the rows does not matter
        (AGREEING[:-1], ["no row for tier BK (experiments)"]),
        (
            [*AGREEING, "XX"],
            ["a row for tier 'XX', which is not defined (the tiers are RT, HP, SP, BP, BK)"],
        ),
    ],
)
def test_rows_that_disagree_with_the_definition_are_named(rows, problems):
    assert row_problems(rows) == problems
