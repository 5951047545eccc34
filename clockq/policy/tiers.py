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


DEFAULT_TIERS: tuple[TierSpec, ...] = (
    TierSpec("RT", 0, "real-time inference", "rt", 50),
    TierSpec("HP", 1, "fine-tuning", "hp", 60_000),
    TierSpec("SP", 2, "standard training", "sp", 600_000),
    TierSpec("BP", 3, "batch analytics", "bp", 4 * 3_600_000),
    TierSpec("BK", 4, "experiments", "bk", None),
)

TIER_CODES = tuple(t.code for t in DEFAULT_TIERS)
QUEUES_IN_ORDER = tuple(t.queue_name for t in DEFAULT_TIERS)
