"""The KPI arithmetic, with tables: histogram quantiles, rates, cost, minute shares, reports."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from clockq.policy.kpis import (
    WAIT_BUCKETS_MS,
    Totals,
    ceil_minute,
    charged_gpu_hours,
    cost_per_useful_gpu_hour,
    empty_counts,
    floor_minute,
    merge_counts,
    minute_shares,
    quantile_ms,
    ratio,
    report,
    wait_bucket,
)

OVERFLOW = len(WAIT_BUCKETS_MS)


def histogram(**by_index: int) -> list[int]:
    """A histogram with counts at bucket indices: histogram(b0=3, b2=1)."""
    counts = empty_counts()
    for key, n in by_index.items():
        counts[int(key[1:])] = n
    return counts


@pytest.mark.parametrize(
    ("wait_ms", "bucket"),
    [(0, 0), (50, 0), (51, 1), (1_000, 4), (60_000, 9), (60_001, 10), (86_400_000, 19), (86_400_001, OVERFLOW)],
)
def test_wait_bucket_holds_its_upper_bound(wait_ms, bucket):
    assert wait_bucket(wait_ms) == bucket


@pytest.mark.parametrize(
    ("counts", "q", "expected_ms"),
    [
        (empty_counts(), 0.95, None),  # no waits: unknown, not 0
        # 10 waits in [0, 50]: rank 9.5 of 10 -> 0 + 50 x 9.5 / 10
        (histogram(b0=10), 0.95, 47.5),
        (histogram(b0=10), 0.5, 25.0),
        # 19 in [0, 50], 1 in (50, 100]: rank 19 is the last of the first bucket
        (histogram(b0=19, b1=1), 0.95, 50.0),
        # 10 in (1 s, 2.5 s], 10 in (10 s, 30 s]: rank 19 -> 9th of 10 in (10 s, 30 s]
        (histogram(b5=10, b8=10), 0.95, 10_000 + 20_000 * 9 / 10),
        (histogram(b5=10, b8=10), 0.5, 1_000 + 1_500 * 10 / 10),
        # the rank lands in the overflow bucket: the highest finite bound
        (histogram(b0=1, **{f"b{OVERFLOW}": 9}), 0.95, 86_400_000.0),
        (histogram(b3=4), 0.0, 250.0),  # q = 0: the lowest non-empty bucket's lower bound
        (histogram(b3=4), 1.0, 500.0),
    ],
)
def test_quantile_interpolates_within_the_bucket_like_prometheus(counts, q, expected_ms):
    assert quantile_ms(counts, q) == (None if expected_ms is None else pytest.approx(expected_ms))


def test_quantile_refuses_a_q_outside_0_to_1():
    with pytest.raises(ValueError):
        quantile_ms(histogram(b0=1), 95)


def test_merge_counts_adds_bucket_by_bucket_and_refuses_another_shape():
    assert merge_counts(histogram(b0=1, b3=2), histogram(b3=1, b4=5)) == histogram(b0=1, b3=3, b4=5)
    with pytest.raises(ValueError):
        merge_counts(empty_counts(), [1, 2, 3])


@pytest.mark.parametrize(("part", "whole", "expected"), [(3, 4, 0.75), (0, 4, 0.0), (0, 0, None), (5, 0, None)])
def test_ratio_of_nothing_is_unknown(part, whole, expected):
    assert ratio(part, whole) == expected


@pytest.mark.parametrize(
    ("price", "capacity_h", "useful_h", "expected"),
    [
        (2.5, 8.0, 4.0, 5.0),  # half the capacity did kept work: twice the price
        (2.5, 8.0, 8.0, 2.5),
        (3.0, 10.0, 0.0, None),  # no kept work: no cost per unit of it
        (0.0, 10.0, 5.0, 0.0),
    ],
)
def test_cost_per_useful_gpu_hour_pays_for_idle_capacity_too(price, capacity_h, useful_h, expected):
    assert cost_per_useful_gpu_hour(price=price, capacity_gpu_hours=capacity_h, useful_gpu_hours=useful_h) == expected


@pytest.mark.parametrize(
    ("busy_ms", "all_busy_ms", "capacity_ms", "expected_h"),
    [
        (1_800_000, 3_600_000, 7_200_000, 1.0),  # half the busy time: half of 2 GPU-hours
        (0, 3_600_000, 7_200_000, 0.0),
        (0, 0, 7_200_000, 0.0),  # nobody busy: nobody charged
    ],
)
def test_a_tier_is_charged_capacity_in_proportion_to_its_busy_time(busy_ms, all_busy_ms, capacity_ms, expected_h):
    assert charged_gpu_hours(busy_ms=busy_ms, all_busy_ms=all_busy_ms, capacity_ms=capacity_ms) == expected_h


def at(minute: int, second: float = 0) -> datetime:
    whole = int(second)
    return datetime(2026, 12, 1, 10, minute, whole, round((second - whole) * 1e6), tzinfo=UTC)


@pytest.mark.parametrize(
    ("started", "ended", "shares"),
    [
        (at(0, 10), at(0, 40), [(at(0), 30_000.0)]),
        (at(0, 50), at(1, 5), [(at(0), 10_000.0), (at(1), 5_000.0)]),  # across a minute boundary
        (at(0, 30), at(3, 0), [(at(0), 30_000.0), (at(1), 60_000.0), (at(2), 60_000.0)]),
        (at(2, 0), at(2, 0), [(at(2), 0.0)]),  # a lost slice with no time still has a minute
        (at(0, 59.5), at(1, 0.25), [(at(0), 500.0), (at(1), 250.0)]),
    ],
)
def test_minute_shares_split_a_slice_over_the_minutes_it_ran(started, ended, shares):
    assert minute_shares(started, ended) == shares


@pytest.mark.parametrize(
    ("when", "floor", "ceil"),
    [(at(5, 0), at(5, 0), at(5, 0)), (at(5, 0.001), at(5, 0), at(6, 0)), (at(5, 59.9), at(5, 0), at(6, 0))],
)
def test_minutes_round_down_and_up(when, floor, ceil):
    assert (floor_minute(when), ceil_minute(when)) == (floor, ceil)


def test_totals_add_up_field_by_field():
    a = Totals(started=2, wait_ms_sum=100, wait_counts=histogram(b1=2), succeeded=1, slice_outcomes={"yielded": 3})
    b = Totals(started=1, wait_ms_sum=40, wait_counts=histogram(b0=1), timed_out=1, slice_outcomes={"yielded": 1})
    a.add(b)
    assert (a.started, a.wait_ms_sum, a.succeeded, a.timed_out) == (3, 140, 1, 1)
    assert a.wait_counts == histogram(b0=1, b1=2) and a.slice_outcomes == {"yielded": 4}


def test_report_of_a_tier_by_hand():
    # Given 4 jobs started (waits 20, 30, 70 and 4000 ms), 5 ended (2 succeeded, 1 of them on
    # time, 1 failed, 1 timed out, 1 cancelled), 2 GPU-minutes of capacity, 60 s of slices of
    # which 45 s useful, util 0.5 over 40 s of work; 2 switches costing 30 ms in all.
    totals = Totals(
        started=4,
        wait_ms_sum=20 + 30 + 70 + 4000,
        wait_counts=histogram(b0=2, b1=1, b6=1),
        succeeded=2,
        failed=1,
        timed_out=1,
        cancelled=1,
        on_time=1,
        late=1,
        promotions=2,
        slices=3,
        slice_outcomes={"yielded": 2, "completed": 1},
        busy_ms=60_000,
        useful_ms=45_000,
        util_ms=20_000,
        switches=2,
        switch_ms_sum=30,
    )
    kpis = report(totals, capacity_ms=120_000, all_busy_ms=60_000, price=3.0, wait_target_ms=60_000)
    assert kpis["wait_mean_s"] == pytest.approx(4.12 / 4)
    # rank 0.95 x 4 = 3.8: the 4th wait, alone in (2.5 s, 5 s]: 2500 + 2500 x 0.8 = 4500 ms
    assert kpis["wait_p95_s"] == pytest.approx(4.5)
    assert kpis["wait_target_s"] == 60.0
    assert kpis["ended"] == {"succeeded": 2, "failed": 1, "timed_out": 1, "cancelled": 1}
    assert kpis["timeout_rate"] == pytest.approx(1 / 4)  # cancelled left out
    assert kpis["on_time_rate"] == pytest.approx(1 / 4)
    assert kpis["gpu_busy_share"] == pytest.approx(0.5)
    assert kpis["gpu_util_mean"] == pytest.approx(20_000 / 120_000)
    assert kpis["useful_gpu_hours"] == pytest.approx(45 / 3600)
    # the only busy tier is charged all 2 GPU-minutes: 3.0 x (2/60) / (45/3600) = 8.0
    assert kpis["cost_per_useful_gpu_hour"] == pytest.approx(8.0)
    assert kpis["switch_mean_ms"] == pytest.approx(15.0)
    assert kpis["slice_outcomes"] == {"completed": 1, "yielded": 2}


def test_report_of_nothing_has_unknown_rates_not_zeros():
    kpis = report(Totals(), capacity_ms=0, all_busy_ms=0, price=2.5)
    for name in (
        "wait_mean_s",
        "wait_p95_s",
        "timeout_rate",
        "on_time_rate",
        "switch_mean_ms",
        "gpu_busy_share",
        "gpu_util_mean",
        "cost_per_useful_gpu_hour",
    ):
        assert kpis[name] is None, name
    assert kpis["started"] == 0 and kpis["useful_gpu_hours"] == 0
