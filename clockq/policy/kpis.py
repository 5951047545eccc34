"""KPI arithmetic shared by the rollup, /api/kpis, /metrics and the dashboard. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

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


# --- the arithmetic ----------------------------------------------------------------------------

MINUTE_MS = 60_000
HOUR_MS = 3_600_000


def empty_counts() -> list[int]:
    return [0] * (len(WAIT_BUCKETS_MS) + 1)


def merge_counts(into: list[int], counts: Sequence[int]) -> list[int]:
    """Add `counts` to `into` bucket by bucket (in place; returned for chaining)."""
    if len(counts) != len(into):
        raise ValueError(f"a wait histogram has {len(into)} buckets, not {len(counts)}")
    for i, n in enumerate(counts):
        into[i] += n
    return into


def quantile_ms(counts: Sequence[int], q: float) -> float | None:
    """The q-quantile (0..1) of the waits in histogram `counts`, None when it is empty.

    Estimated the way Prometheus's histogram_quantile() does it: find the bucket holding the
    rank q x total, and interpolate linearly between its lower and upper bound, as if its waits
    were spread evenly (the first bucket starts at 0). A rank that falls in the overflow bucket
    gets the highest finite bound, since the overflow bucket has no upper bound. The error is at
    most the width of the bucket; the bounds sit on the tiers' targets, so "p95 within target"
    is never misjudged by the interpolation."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"a quantile is between 0 and 1, not {q}")
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            if i == len(WAIT_BUCKETS_MS):
                return float(WAIT_BUCKETS_MS[-1])
            lower = WAIT_BUCKETS_MS[i - 1] if i else 0
            return lower + (WAIT_BUCKETS_MS[i] - lower) * (rank - seen) / n
        seen += n
    return float(WAIT_BUCKETS_MS[-1])  # unreachable: the last non-empty bucket reaches total


def ratio(part: float, whole: float) -> float | None:
    """part / whole, or None when there is nothing to divide by (a rate of nothing is unknown,
    not 0)."""
    return part / whole if whole else None


def cost_per_useful_gpu_hour(*, price: float, capacity_gpu_hours: float, useful_gpu_hours: float) -> float | None:
    """What a GPU-hour of kept work cost: every GPU-hour of capacity is paid for, busy or idle,
    and only useful GPU-hours count as output."""
    return ratio(price * capacity_gpu_hours, useful_gpu_hours)


def charged_gpu_hours(*, busy_ms: float, all_busy_ms: float, capacity_ms: float) -> float:
    """A tier's part of the capacity: the GPU time its slices held, plus a share of the idle
    time in proportion to it, so that the tiers' parts add up to the whole capacity."""
    return (ratio(busy_ms, all_busy_ms) or 0.0) * capacity_ms / HOUR_MS


def floor_minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def ceil_minute(at: datetime) -> datetime:
    floor = floor_minute(at)
    return floor if floor == at else floor + timedelta(minutes=1)


def minute_shares(started_at: datetime, ended_at: datetime) -> list[tuple[datetime, float]]:
    """(minute, ms of [started_at, ended_at) within that minute) for every minute it touches,
    so that a slice's GPU time counts in the minutes it ran, not all in the one it ended."""
    if ended_at <= started_at:
        return [(floor_minute(ended_at), 0.0)]
    shares = []
    minute = floor_minute(started_at)
    while minute < ended_at:
        following = minute + timedelta(minutes=1)
        overlap = min(ended_at, following) - max(started_at, minute)
        shares.append((minute, overlap / timedelta(milliseconds=1)))
        minute = following
    return shares


# --- what a window adds up to ----------------------------------------------------------------

ENDED_STATES = ("succeeded", "failed", "timed_out", "cancelled")


@dataclass
class Totals:
    """The additive facts of one tier over some minutes (a KpiMinute row, or a sum of them)."""

    started: int = 0
    wait_ms_sum: int = 0
    wait_counts: list[int] = field(default_factory=empty_counts)
    succeeded: int = 0
    failed: int = 0
    timed_out: int = 0
    cancelled: int = 0
    on_time: int = 0
    late: int = 0
    promotions: int = 0
    slices: int = 0
    slice_outcomes: dict[str, int] = field(default_factory=dict)
    busy_ms: float = 0
    useful_ms: float = 0
    util_ms: float = 0.0
    switches: int = 0
    switch_ms_sum: float = 0.0

    def add(self, other: Totals) -> Totals:
        for name in _SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        merge_counts(self.wait_counts, other.wait_counts)
        for outcome, n in other.slice_outcomes.items():
            self.slice_outcomes[outcome] = self.slice_outcomes.get(outcome, 0) + n
        return self


_SUMMED = tuple(f.name for f in fields(Totals) if f.name not in ("wait_counts", "slice_outcomes"))


def report(
    totals: Totals, *, capacity_ms: float, all_busy_ms: float, price: float, wait_target_ms: int | None = None
) -> dict[str, Any]:
    """The KPIs of one tier (or of all, with all_busy_ms == totals.busy_ms) over a window whose
    GPUs offered `capacity_ms` of time. Rates are None where their denominator is 0."""
    judged = totals.succeeded + totals.failed + totals.timed_out  # cancelled jobs are nobody's miss
    mean_ms = ratio(totals.wait_ms_sum, totals.started)
    p95_ms = quantile_ms(totals.wait_counts, 0.95)
    charged = charged_gpu_hours(busy_ms=totals.busy_ms, all_busy_ms=all_busy_ms, capacity_ms=capacity_ms)
    useful_h = totals.useful_ms / HOUR_MS
    return {
        "started": totals.started,
        "wait_mean_s": None if mean_ms is None else mean_ms / 1000,
        "wait_p95_s": None if p95_ms is None else p95_ms / 1000,
        "wait_target_s": None if wait_target_ms is None else wait_target_ms / 1000,
        "wait_histogram": {"bounds_ms": list(WAIT_BUCKETS_MS), "counts": list(totals.wait_counts)},
        "ended": {state: getattr(totals, state) for state in ENDED_STATES},
        "timeout_rate": ratio(totals.timed_out, judged),
        "on_time": totals.on_time,
        "on_time_rate": ratio(totals.on_time, judged),
        "late": totals.late,
        "promotions": totals.promotions,
        "slices": totals.slices,
        "slice_outcomes": dict(sorted(totals.slice_outcomes.items())),
        "switches": totals.switches,
        "switch_mean_ms": ratio(totals.switch_ms_sum, totals.switches),
        "gpu_busy_share": ratio(totals.busy_ms, capacity_ms),
        "gpu_util_mean": ratio(totals.util_ms, capacity_ms),
        "busy_gpu_hours": totals.busy_ms / HOUR_MS,
        "useful_gpu_hours": useful_h,
        # Unknown, not free, when no GPU capacity was recorded.
        "cost_per_useful_gpu_hour": cost_per_useful_gpu_hour(
            price=price, capacity_gpu_hours=charged, useful_gpu_hours=useful_h
        )
        if capacity_ms
        else None,
    }
