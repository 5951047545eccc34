"""A promoted job keeps its promotion until it has had the first rung of service in the higher
tier (workers/run/tiers.py), not one slice."""

from __future__ import annotations

from clockq.policy.ordering import Ladder
from workers.run.tiers import RunTiers
from workers.runtime import TierInfo

HP = TierInfo(2, "HP", 1, "hp", 50, 20, 60_000, None)
SP = TierInfo(3, "SP", 2, "sp", 50, 20, 600_000, None)
LADDER = Ladder(base_gpu_s=(1.0, 8.0))  # HP's first rung: 1.25 ** 3 = 1.953 s


def test_a_promoted_job_goes_home_once_it_has_had_its_first_rung_there():
    tiers = RunTiers(current=HP, home=SP, served_ms=1000.0)  # 1 s served there before this claim
    tiers.serve(900.0, LADDER)
    assert tiers.current is HP and tiers.returning_from is None  # 1.9 s: not yet
    tiers.serve(60.0, LADDER)
    assert tiers.current is SP and tiers.returning_from is HP


def test_a_job_in_its_own_tier_counts_nothing_and_stays():
    tiers = RunTiers(current=SP, home=SP)
    tiers.serve(10_000.0, LADDER)
    assert tiers.current is SP and tiers.returning_from is None and tiers.served_ms == 0.0
