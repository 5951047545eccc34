"""Starvation control: rounds, skips, promotion and batch chances, as pure rules.

A promotion tick hands these functions the facts of the round that just ended (which jobs
started slices, which jobs waited through it) and gets decisions back; a service in the core
applies them with compare-and-set transitions. The live beat task and the trace simulator call
the same code.

- A **round** is a promotion tick in which the pool started at least one slice: the window from
  the end of the previous tick to this one holds a slice start (a claim or a continued slice).
  A tick without a slice start is not a round: it neither counts nor breaks a streak.
- A waiting job is **skipped** in a round when it was queued for the whole round (in its queue
  before the round began and still there at its end) and none of the slices started in the
  round was its own.
- A job skipped in `promote_after_rounds` consecutive rounds is **promoted** to `promote_to`:
  it is scheduled there until it has had a fair amount of service there
  (`ordering.Ladder.promotion_service`), then returns to its own tier. Starting a slice, or leaving the
  queue (held, cancelled), restarts the streak.
- A **batch chance** lifts the oldest waiting jobs of a tier to a more urgent tier, as a
  promotion, on a timer, whatever the rounds say; its level there counts from the lift
  (`Promotion.fresh_level`), so that it is scheduled, however long it has run.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

# The clock is injected: the live tick passes datetimes, the trace simulator seconds.
Instant = TypeVar("Instant", datetime, float)

# How often beat runs the promotion tick, and gives each tier its batch chance (the seeded
# periodic tasks, clockq/jobs/periodic.py; the trace simulator uses the same defaults).
PROMOTION_TICK_S = 10
BATCH_CHANCE_EVERY_S = 2 * 3600


@dataclass(frozen=True)
class TierRule:
    """A tier's promotion settings, as the tick sees them."""

    code: str
    promote_after_rounds: int | None  # None: this tier is never promoted
    promote_to: str | None


@dataclass(frozen=True)
class WaitingJob(Generic[Instant]):
    id: int
    tier: str  # where it waits now
    home_tier: str  # the tier it was submitted to; differs while it is promoted
    skipped_rounds: int
    waiting_since: Instant  # when it last entered a queue


@dataclass(frozen=True)
class RoundFacts(Generic[Instant]):
    started_at: Instant  # the end of the previous tick
    slices_started: int
    jobs_that_started: Collection[int]


@dataclass(frozen=True)
class Promotion:
    job_id: int
    from_tier: str
    to_tier: str
    reason: str
    # Whether its service level counts from now (`ordering.Ladder`): a batch chance is a chance
    # to be scheduled, whatever service the job has had; a promotion keeps the job's service,
    # and moves it up among the jobs of its level (clockq/policy/ordering.py says why).
    fresh_level: bool = False


@dataclass(frozen=True)
class TickDecisions:
    is_round: bool
    skips: dict[int, int]  # job id -> its new count of consecutive skipped rounds
    promotions: list[Promotion]


def decide_round(
    facts: RoundFacts[Instant], waiting: Sequence[WaitingJob[Instant]], rules: Mapping[str, TierRule]
) -> TickDecisions:
    """Count this round's skips and decide which jobs are promoted."""
    if facts.slices_started <= 0:
        return TickDecisions(is_round=False, skips={}, promotions=[])
    skips: dict[int, int] = {}
    promotions: list[Promotion] = []
    for job in waiting:
        if job.id in facts.jobs_that_started or job.waiting_since > facts.started_at:
            continue  # it ran, or it did not wait through the whole round
        if job.tier != job.home_tier:
            continue  # already promoted, waiting for its slice in the higher tier
        count = job.skipped_rounds + 1
        rule = rules.get(job.tier)
        if rule and rule.promote_after_rounds and rule.promote_to and count >= rule.promote_after_rounds:
            promotions.append(
                Promotion(
                    job.id,
                    job.tier,
                    rule.promote_to,
                    f"promoted {job.tier} -> {rule.promote_to}: skipped in {count} "
                    f"consecutive rounds while {facts.slices_started} slice(s) went to other jobs in the last round",
                )
            )
        else:
            skips[job.id] = count
    return TickDecisions(is_round=True, skips=skips, promotions=promotions)


def batch_chance(
    waiting_oldest_first: Sequence[WaitingJob[Instant]], *, tier: str, jobs: int, to_tier: str | None
) -> list[Promotion]:
    """The `jobs` oldest jobs waiting in their own `tier` are lifted to `to_tier`."""
    if jobs <= 0 or not to_tier:
        return []
    chosen = [j for j in waiting_oldest_first if j.tier == tier and j.home_tier == tier][:jobs]
    return [
        Promotion(
            j.id, tier, to_tier, f"batch chance: lifted to {to_tier}, the oldest waiting {tier} job", fresh_level=True
        )
        for j in chosen
    ]


# --- the tier table ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TierLinks:
    rank: int
    promote_to: str | None
    chance_to: str | None


@dataclass(frozen=True)
class Problem:
    tier: str
    field: str
    message: str


def promotion_problems(tiers: Mapping[str, TierLinks]) -> list[Problem]:
    """What is wrong with a tier table's promotion links. A job may only be lifted to a more
    urgent tier (a lower rank): then no chain of promotions can loop back."""
    problems: list[Problem] = []
    for code, links in sorted(tiers.items(), key=lambda kv: kv[1].rank):
        for field, target in (("promote_to", links.promote_to), ("chance_to", links.chance_to)):
            if target is None:
                continue
            if target not in tiers:
                problems.append(Problem(code, field, f"{code}: unknown tier {target!r}."))
            elif target == code:
                problems.append(Problem(code, field, f"{code} cannot be lifted to itself."))
            elif tiers[target].rank >= links.rank:
                loop = f" (and {target} -> {code} would loop)" if _reaches(tiers, target, code) else ""
                problems.append(
                    Problem(
                        code,
                        field,
                        f"{code} -> {target}: jobs may only be lifted to a more urgent tier "
                        f"(rank below {links.rank}); {target} has rank {tiers[target].rank}{loop}.",
                    )
                )
    return problems


def _reaches(tiers: Mapping[str, TierLinks], start: str, goal: str) -> bool:
    seen: set[str] = set()
    frontier = [start]
    while frontier:
        code = frontier.pop()
        if code == goal:
            return True
        if code in seen or code not in tiers:
            continue
        seen.add(code)
        frontier += [t for t in (tiers[code].promote_to, tiers[code].chance_to) if t]
    return False
