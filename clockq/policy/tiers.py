"""Which tiers exist and what each one is: the one definition, with the specification's numbers.

A tier is its code (what users, forms and the API name it), its rank (its place in the order,
0 the most urgent: workers drain lower ranks first), its Celery queue, and what it is to the
policy: whether its jobs interrupt their victim (`interrupts`), share the best-effort GPUs
(`best_effort`), are admitted whatever the forecast (`always_admitted`), and are real-time work
(`realtime`: worthless late, see `TierSpec`). Nothing else decides which tiers exist or what
they are: the policy asks these fields (never a rank number or a code), forms and serializers
offer TIER_CODES, the workers consume QUEUES_IN_ORDER, and the QueueTier rows (clockq.jobs) are
seeded from TIERS. Those rows hold only what an operator may tune per tier (its description,
service levels, slices, starvation control), starting from the numbers below, keyed by the code;
there must be one row per tier and none for a code not defined here (`row_problems`), which a
system check and the workers' tier cache both ask. tests/policy/test_tier_constants.py fails
when a rank number or a tier code is written as a constant anywhere else in the production
packages.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class TierSpec:
    """What a tier is: its identity (code, rank, queue), what it is to the policy (the flags
    below), and the defaults of what an operator may tune in its QueueTier row (its wait
    target, slices, start timeout and starvation control)."""

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
    # A waiting job of it makes its victim leave at once, at its next step, instead of after the
    # victim's slice: its wait target is a promise, and its jobs are few enough that their
    # interrupts stay within the overhead budget (ordering.leaves_at).
    interrupts: bool = False
    # It shares the best-effort GPUs (ordering.LOWER_TIER_SHARE): under saturation its jobs still
    # progress on a bounded share, without taking GPUs from the urgent tiers beyond it.
    best_effort: bool = False
    # Admitted whatever the forecast (control.admits): its work is worthless late, and small.
    always_admitted: bool = False
    # Real-time work, worthless late: it takes the standby RT lanes (lanes.py), never waits
    # behind the best-effort share and takes from it, and never displaces its own tier (one of
    # its slices is another of its jobs' latency promise).
    realtime: bool = False


# The specification: RT work is worthless after 1 s; an SP job skipped in 3 consecutive rounds
# moves to HP; a BP job is lifted to SP every 2 h (the batch-chance periodic task).
RT = TierSpec(
    "RT", 0, "real-time inference", "rt", 50, start_timeout_ms=1_000,
    interrupts=True, always_admitted=True, realtime=True,
)  # fmt: skip
HP = TierSpec("HP", 1, "fine-tuning", "hp", 60_000, interrupts=True)
SP = TierSpec("SP", 2, "standard training", "sp", 600_000, promote_after_rounds=3, promote_to=HP.code)
BP = TierSpec("BP", 3, "batch analytics", "bp", 4 * 3_600_000, chance_jobs=1, chance_to=SP.code, best_effort=True)
BK = TierSpec("BK", 4, "experiments", "bk", None, best_effort=True)
TIERS: tuple[TierSpec, ...] = (RT, HP, SP, BP, BK)

TIER_CODES = tuple(t.code for t in TIERS)  # most urgent first
QUEUES_IN_ORDER = tuple(t.queue_name for t in TIERS)
TIER_BY_CODE = {t.code: t for t in TIERS}
TIER_BY_RANK = {t.rank: t for t in TIERS}
TIER_BY_QUEUE = {t.queue_name: t for t in TIERS}
REALTIME_QUEUES = tuple(t.queue_name for t in TIERS if t.realtime)  # what an RT lane takes
# The policy asks these for every job it compares, millions of times a replay: sets of ranks.
INTERRUPTING_RANKS = frozenset(t.rank for t in TIERS if t.interrupts)
BEST_EFFORT_RANKS = frozenset(t.rank for t in TIERS if t.best_effort)
REALTIME_RANKS = frozenset(t.rank for t in TIERS if t.realtime)
ALWAYS_ADMITTED = frozenset(t.code for t in TIERS if t.always_admitted)
# What a submission gets when it names no tier (the form's first choice): standard training.
DEFAULT_TIER = SP


class UnknownTier(ValueError):
    """A tier code that TIERS does not define."""


def tier(code: str) -> TierSpec:
    """The tier with this code, or UnknownTier naming the ones there are."""
    try:
        return TIER_BY_CODE[code]
    except (KeyError, TypeError):
        raise UnknownTier(f"no tier {code!r}; the tiers are {', '.join(TIER_CODES)}") from None


def at_rank(rank: int) -> TierSpec | None:
    """The tier of this rank, or None for a rank no tier has (a queue that is not a tier's)."""
    return TIER_BY_RANK.get(rank)


def row_problems(codes: Iterable[str]) -> list[str]:
    """How the tier rows, by their codes, differ from TIERS, a sentence each; [] when every
    defined tier has one row and there is no other. A row holds only tunables: its rank and
    queue are the definition's."""
    problems: list[str] = []
    seen: set[str] = set()
    for code in codes:
        if code not in TIER_BY_CODE:
            problems.append(f"a row for tier {code!r}, which is not defined (the tiers are {', '.join(TIER_CODES)})")
        seen.add(code)
    problems += [f"no row for tier {code} ({TIER_BY_CODE[code].use})" for code in TIER_CODES if code not in seen]
    return problems
