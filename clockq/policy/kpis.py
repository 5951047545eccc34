"""KPI arithmetic shared by the rollup, /api/kpis, /metrics and the dashboard. Pure."""

from __future__ import annotations

# Upper bounds (ms) of the wait histogram's buckets; one more bucket holds longer waits. Chosen
# around the tiers' targets (RT 50 ms, HP 1 min, SP 10 min, BP 4 h), so each target is a bound.
WAIT_BUCKETS_MS: tuple[int, ...] = (
    50,
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    30_000,
    60_000,
    120_000,
    300_000,
    600_000,
    1_200_000,
    1_800_000,
    3_600_000,
    7_200_000,
    14_400_000,
    28_800_000,
    86_400_000,
)


def wait_bucket(wait_ms: int) -> int:
    """Index of the bucket that holds `wait_ms` (len(WAIT_BUCKETS_MS) for longer waits)."""
    for i, bound in enumerate(WAIT_BUCKETS_MS):
        if wait_ms <= bound:
            return i
    return len(WAIT_BUCKETS_MS)
