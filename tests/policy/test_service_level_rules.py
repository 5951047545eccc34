"""Service levels as tables: wait verdicts and what on time means."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from clockq.policy.service_levels import WaitVerdict, finished_on_time, judge_wait

W, L, T = WaitVerdict.WITHIN, WaitVerdict.LATE, WaitVerdict.TIMED_OUT


@pytest.mark.parametrize(
    ("waited", "target", "timeout", "verdict"),
    [
        (40, 50, 1000, W),
        (50, 50, 1000, W),  # at the target is within it
        (51, 50, 1000, L),
        (1000, 50, 1000, L),
        (1001, 50, 1000, T),
        (10**9, None, None, W),  # BK: best effort
        (61_000, 60_000, None, L),  # other tiers are only marked late
        (5, None, 1, T),
    ],
)
def test_judge_wait(waited, target, timeout, verdict):
    assert judge_wait(waited, target_ms=target, start_timeout_ms=timeout) == verdict


NOW = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("succeeded", "finished", "deadline", "wait", "target", "on_time"),
    [
        (True, NOW, NOW + timedelta(seconds=1), 10**9, 1, True),  # a deadline overrides the wait
        (True, NOW, NOW, 0, None, True),
        (True, NOW, NOW - timedelta(seconds=1), 0, None, False),
        (True, NOW, None, 600_000, 600_000, True),
        (True, NOW, None, 600_001, 600_000, False),
        (True, NOW, None, None, None, True),  # BK has no target
        (True, NOW, None, None, 50, False),  # never measured: not provably on time
        (False, NOW, NOW + timedelta(hours=1), 0, None, False),  # failed or timed out: never
        (True, None, None, 0, None, False),
    ],
)
def test_on_time(succeeded, finished, deadline, wait, target, on_time):
    assert (
        finished_on_time(
            succeeded=succeeded, finished_at=finished, deadline=deadline, first_wait_ms=wait, target_ms=target
        )
        == on_time
    )
