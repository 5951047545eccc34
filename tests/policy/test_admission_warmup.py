"""Admission waits out persistence's warm-up, and a held job's page says when it is expected to be
released (clockq/policy/control.py): tables of plain inputs, and the replay on the same rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from clockq.policy import control
from clockq.policy.control import Basis, Thresholds, decide, decide_admission, expected_release, threshold_problems
from clockq.replay.config import Config, SwitchCost
from clockq.replay.model import Trace, TraceJob
from clockq.replay.policies import replay

WARM = Thresholds(warmup_samples=60)
DEMO_BACKLOG = 2.0  # a two-GPU demo's first backlog: 13 jobs over 2 GPUs, clamped at 200%


@pytest.mark.parametrize(
    ("forecast", "is_open", "basis", "new", "reason"),
    [
        # persistence during the warm-up: admission stays open, or reopens, whatever it says
        (DEMO_BACKLOG, True, Basis("persistence", 1), True, "admission open: forecast 200% is persistence, acted on"),
        (0.9, True, Basis("persistence", 59), True, "only once 60 load samples are kept (59 so far)"),
        (0.9, False, Basis("persistence", 10), True, "admission reopened: forecast 90% is persistence"),
        # persistence after the warm-up: the usual band
        (0.9, True, Basis("persistence", 60), False, "admission closed: forecast 90% > 85%"),
        (0.8, False, Basis("persistence", 600), False, "admission stays closed"),
        # a model's forecast acts at once, however little history there is
        (0.9, True, Basis("lstm", 0), False, "admission closed: forecast 90% > 85%"),
        (0.9, True, Basis("linear", 5), False, "admission closed"),
        # no basis: a forecast acted on as it is (an operator's test, the replay of old)
        (0.9, True, None, False, "admission closed"),
    ],
)
def test_admission_acts_on_persistence_only_after_the_warm_up(forecast, is_open, basis, new, reason):
    d = decide_admission(forecast, is_open, WARM, basis)
    assert d.new is new and reason in d.reason


def test_without_a_warm_up_persistence_acts_at_once_as_before():
    assert decide_admission(0.9, True, Thresholds(), Basis("persistence", 0)).new is False


def test_the_warm_up_leaves_prefetch_and_scale_out_alone():
    decisions = decide(DEMO_BACKLOG, control.Current(), 2, WARM, Basis("persistence", 3))
    by_field = {d.field: d for d in decisions}
    assert by_field[control.ADMISSION].new is True
    assert by_field[control.WORKERS].new == 6  # ceil(2 x 200% / 70%)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "60"])
def test_a_warm_up_that_is_not_a_count_is_refused(bad):
    assert [p.field for p in threshold_problems(Thresholds(warmup_samples=bad))] == ["warmup_samples"]


NOW = datetime(2026, 12, 2, 19, 0, 0, tzinfo=UTC)


def release(**changes) -> control.ExpectedRelease:
    state = dict(
        admission_open=False,
        forced_by=None,
        forecast=1.4,
        forecast_at=NOW - timedelta(seconds=20),
        every_s=60.0,
        now=NOW,
        t=Thresholds(),
    )
    return expected_release(**{**state, **changes})


def test_a_job_held_by_the_forecast_is_asked_again_at_the_next_forecast():
    r = release()
    assert r.at == NOW + timedelta(seconds=40)
    assert r.condition.startswith("at the first forecast at which it would start")
    assert "at the latest when admission reopens: the forecast falls below 75% (the latest forecast is 140%)" in (
        r.condition
    )
    assert (r.forecast, r.reopen_below) == (1.4, 0.75)


def test_holding_all_releases_only_when_admission_reopens():
    r = release(t=Thresholds(hold=control.HOLD_ALL))
    assert r.condition == "when admission reopens: the forecast falls below 75% (the latest forecast is 140%)"


def test_a_late_forecast_is_due_now_and_none_yet_is_due_now():
    assert release(forecast_at=NOW - timedelta(minutes=5)).at == NOW
    assert release(forecast_at=None, forecast=None).at == NOW


def test_an_operators_closure_names_the_operator_and_no_time():
    r = release(forced_by="alice")
    assert (r.at, r.condition) == (None, "when alice reopens admission")


def test_a_straggler_held_while_admission_is_open_goes_at_the_next_forecast():
    r = release(admission_open=True)
    assert r.at == NOW + timedelta(seconds=40) and "admission is open again" in r.condition


# The replay calls the same rule: two GPUs, a burst of eight BK jobs at once, then an SP job.
BURST = Trace(
    "burst",
    [
        *[TraceJob(f"B{i}", 0, 0.0, 300.0, 1, "BK", 1e6, checkpoint_mb=0.0) for i in range(8)],
        TraceJob("S", 0, 61.0, 10.0, 1, "SP", 1e6, checkpoint_mb=0.0),
    ],
)


def replayed(thresholds: Thresholds):
    return replay(BURST, "clockq", Config(gpus=2, switch_cost=SwitchCost(0.0, 0.0), admission=thresholds))


def test_the_replay_uses_the_same_warm_up_rule():
    # Without a warm-up the first sample (400%, clamped to 200%) closes admission, as live did.
    assert replayed(Thresholds(hold=control.HOLD_ALL)).admission_closures == 1
    # With one longer than the burst, persistence never closes it, and nothing is held.
    warm = replayed(Thresholds(hold=control.HOLD_ALL, warmup_samples=60))
    assert (warm.admission_closures, warm.held_jobs) == (0, 0)
