"""Which tiers exist: the one definition, and the specification's numbers for each.

A tier is its code (what users, forms and the API name it), its rank (its place in the order,
0 the most urgent: workers drain lower ranks first) and its Celery queue. Nothing else decides
which tiers exist: forms and serializers offer TIER_CODES, the workers consume QUEUES_IN_ORDER,
and the QueueTier rows (clockq.jobs) are seeded from TIERS. Those rows hold what an operator may
tune per tier (its description, service levels, slices, starvation control), starting from the
numbers below; their code, rank and queue must agree with this table (`row_problems`), which a
system check and the workers' tier cache both ask.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class TierSpec:
    code: str
    rank: int  # 0 is the most urgent; workers drain lower ranks first
    use: str
    queue_name: str
    wait_target_ms: int | None  # None means best effort
    base_slice_ms: int = 50
    min_slice_ms: int = 20
    start_timeout_ms: int | None = None  # not started by then: timed_out instead of late
    promote_after_rounds: int | None = None
    promote_to: str | None = None
    chance_jobs: int = 0  # jobs lifted at each batch chance
    chance_to: str | None = None


# The specification: RT work is worthless after 1 s; an SP job skipped in 3 consecutive rounds
# moves to HP; a BP job is lifted to SP every 2 h (the batch-chance periodic task).
TIERS: tuple[TierSpec, ...] = (
    TierSpec("RT", 0, "real-time inference", "rt", 50, start_timeout_ms=1_000),
    TierSpec("HP", 1, "fine-tuning", "hp", 60_000),
    TierSpec("SP", 2, "standard training", "sp", 600_000, promote_after_rounds=3, promote_to="HP"),
    TierSpec("BP", 3, "batch analytics", "bp", 4 * 3_600_000, chance_jobs=1, chance_to="SP"),
    TierSpec("BK", 4, "experiments", "bk", None),
)

TIER_CODES = tuple(t.code for t in TIERS)  # most urgent first
QUEUES_IN_ORDER = tuple(t.queue_name for t in TIERS)
TIER_BY_CODE = {t.code: t for t in TIERS}


class UnknownTier(ValueError):
    """A tier code that TIERS does not define."""


def tier(code: str) -> TierSpec:
    """The tier with this code, or UnknownTier naming the ones there are."""
    try:
        return TIER_BY_CODE[code]
    except (KeyError, TypeError):
        raise UnknownTier(f"no tier {code!r}; the tiers are {', '.join(TIER_CODES)}") from None


def row_problems(rows: Iterable[tuple[str, int, str]]) -> list[str]:
    """How tier rows, as (code, rank, queue name), differ from TIERS, a sentence each; [] when
    every defined tier has one row that agrees and there is no other."""
    problems: list[str] = []
    seen: set[str] = set()
    for code, rank, queue_name in rows:
        spec = TIER_BY_CODE.get(code)
        if spec is None:
            problems.append(f"a row for tier {code!r}, which is not defined (the tiers are {', '.join(TIER_CODES)})")
            continue
        seen.add(code)
        if rank != spec.rank:
            problems.append(f"tier {code}'s row has rank {rank}, its definition {spec.rank}")
        if queue_name != spec.queue_name:
            problems.append(f"tier {code}'s row has queue {queue_name!r}, its definition {spec.queue_name!r}")
    problems += [f"no row for tier {code} ({TIER_BY_CODE[code].use})" for code in TIER_CODES if code not in seen]
    return problems
