"""The five tiers and their numbers from the specification."""

from __future__ import annotations

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
# moves to HP; a BP job gets one slice through SP every 2 h (the batch-chance periodic task).
DEFAULT_TIERS: tuple[TierSpec, ...] = (
    TierSpec("RT", 0, "real-time inference", "rt", 50, start_timeout_ms=1_000),
    TierSpec("HP", 1, "fine-tuning", "hp", 60_000),
    TierSpec("SP", 2, "standard training", "sp", 600_000, promote_after_rounds=3, promote_to="HP"),
    TierSpec("BP", 3, "batch analytics", "bp", 4 * 3_600_000, chance_jobs=1, chance_to="SP"),
    TierSpec("BK", 4, "experiments", "bk", None),
)

TIER_CODES = tuple(t.code for t in DEFAULT_TIERS)
QUEUES_IN_ORDER = tuple(t.queue_name for t in DEFAULT_TIERS)
