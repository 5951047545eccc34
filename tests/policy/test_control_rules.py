"""The control rules as tables: admission with hysteresis, prefetch, desired workers, thresholds."""

from __future__ import annotations

import math
import random

import pytest

from clockq.policy.control import (
    ADMISSION,
    HOLD_ALL,
    HOLD_WHEN_FULL,
    PREFETCH,
    WORKERS,
    Cluster,
    Current,
    Room,
    Thresholds,
    admits,
    closed_note,
    decide,
    decide_admission,
    decide_prefetch,
    decide_workers,
    forecast_problem,
    gpus_ahead,
    held_note,
    pct,
    release_note,
    threshold_problems,
    weighs_room,
)
from clockq.policy.ordering import Standing

T = Thresholds()  # 85% / 75%, prefetch 30% / 35%, scale out above 70%, at most 64 workers


@pytest.mark.parametrize(
    ("forecast", "is_open", "new", "reason"),
    [
        (0.50, True, True, "admission open: forecast 50% <= 85%"),
        (0.85, True, True, "admission open: forecast 85% <= 85%"),
        (0.8501, True, False, "admission closed: forecast 85.01% > 85%"),
        (0.91, True, False, "admission closed: forecast 91% > 85%"),
        (1.7, True, False, "admission closed: forecast 170% > 85%"),
        (0.91, False, False, "admission stays closed: forecast 91% is not below 75% (closes above 85%)"),
        (0.80, False, False, "admission stays closed: forecast 80% is not below 75% (closes above 85%)"),
        (0.75, False, False, "admission stays closed: forecast 75% is not below 75% (closes above 85%)"),
        (0.7499, False, True, "admission reopened: forecast 74.99% < 75%"),
        (0.0, False, True, "admission reopened: forecast 0% < 75%"),
    ],
)
def test_admission_closes_above_85_and_reopens_only_below_75(forecast, is_open, new, reason):
    d = decide_admission(forecast, is_open, T)
    assert (d.field, d.old, d.new, d.reason) == (ADMISSION, is_open, new, reason)
    assert d.changed == (is_open != new)


@pytest.mark.parametrize(
    ("forecast", "is_on", "new", "reason"),
    [
        (0.10, False, True, "prefetch on: forecast 10% < 30%"),
        (0.30, False, False, "prefetch off: forecast 30% >= 30%"),
        (0.32, True, True, "prefetch stays on: forecast 32% <= 35%"),
        (0.35, True, True, "prefetch stays on: forecast 35% <= 35%"),
        (0.36, True, False, "prefetch off: forecast 36% > 35%"),
        (0.90, False, False, "prefetch off: forecast 90% >= 30%"),
    ],
)
def test_prefetch_turns_on_below_30_and_off_above_35(forecast, is_on, new, reason):
    d = decide_prefetch(forecast, is_on, T)
    assert (d.field, d.old, d.new, d.reason) == (PREFETCH, is_on, new, reason)


@pytest.mark.parametrize(
    ("forecast", "workers", "desired", "reason_part"),
    [
        (0.50, 4, 4, "workers: 4 as now, forecast 50% <= 70%"),
        (0.70, 4, 4, "as now"),
        (0.80, 4, 5, "ceil(4 x 80% / 70%) = 5)"),  # 4.57 -> 5
        (1.40, 4, 8, "scale out to 8 GPU worker(s) from 4: forecast 140% > 70%"),
        (0.71, 1, 2, "= 2)"),  # any excess over 70% asks for one more
        (0.90, 0, 1, "= 1)"),  # no workers at all: ask for one
        (30.0, 4, 64, "capped at 64"),
        (0.20, 100, 100, "as now"),  # never asks for fewer than there are
        (0.90, 100, 100, "capped at 64"),  # above the cap already: keep, do not remove
    ],
)
def test_desired_workers_scale_out_above_70(forecast, workers, desired, reason_part):
    d = decide_workers(forecast, workers, None, T)
    assert d.field == WORKERS and d.new == desired
    assert reason_part in d.reason


def test_desired_workers_formula_matches_the_issue():
    for workers in range(0, 20):
        for f in (0.7001, 0.75, 0.9, 1.0, 1.3):
            assert decide_workers(f, workers, None, T).new == max(1, math.ceil(workers * f / 0.70))


def test_decide_returns_every_rule_in_order_and_flags_the_changes():
    decisions = decide(0.9, Current(admission_open=True, prefetch_on=True, desired_workers=4), 4, T)
    assert [d.field for d in decisions] == [ADMISSION, PREFETCH, WORKERS]
    assert [(d.old, d.new, d.changed) for d in decisions] == [(True, False, True), (True, False, True), (4, 6, True)]
    calm = decide(0.5, Current(True, False, 4), 4, T)
    assert not any(d.changed for d in calm)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.01, 101.0, "0.5", None, True])
def test_a_broken_forecast_is_refused(bad):
    assert forecast_problem(bad)
    with pytest.raises(ValueError):
        decide(bad, Current(), 1, T)


def run(forecasts, start_open=True):
    """Admission through a series of forecasts: how many times it changed, and where it ended."""
    is_open, flips = start_open, 0
    for f in forecasts:
        d = decide_admission(f, is_open, T)
        flips += d.changed
        is_open = d.new
    return flips, is_open


def test_a_forecast_oscillating_around_85_changes_admission_once():
    assert run([0.84, 0.86] * 50) == (1, False)
    assert run([0.86, 0.84] * 50) == (1, False)


def test_noise_between_76_and_90_changes_admission_at_most_once():
    rng = random.Random(11)
    for start_open in (True, False):
        for _ in range(50):
            flips, _end = run([rng.uniform(0.76, 0.90) for _ in range(200)], start_open)
            assert flips <= 1


def test_a_real_drop_reopens_and_a_real_rise_closes_again():
    assert run([0.9, 0.8, 0.7, 0.8, 0.9]) == (3, False)  # closed, reopened at 70%, closed at 90%


def test_prefetch_around_30_does_not_flap():
    is_on, flips = False, 0
    for f in [0.29, 0.31, 0.33, 0.29, 0.34] * 20:
        d = decide_prefetch(f, is_on, T)
        flips += d.changed
        is_on = d.new
    assert (flips, is_on) == (1, True)


FULL = Room(gpus=4, free_gpus=0, gpus_ahead=4)  # no GPU free, and queued work ahead asks for all 4


@pytest.mark.parametrize(
    ("room", "full"),
    [
        (FULL, True),
        (Room(gpus=4, free_gpus=0, gpus_ahead=9), True),
        (Room(gpus=4, free_gpus=0, gpus_ahead=3), False),  # it would be next for a GPU
        (Room(gpus=4, free_gpus=1, gpus_ahead=9), False),  # a GPU is free: never held while one is
        (Room(gpus=0, free_gpus=0, gpus_ahead=9), False),  # the GPUs are not known: no hold on a guess
    ],
)
def test_a_room_is_full_only_when_the_job_would_wait_anyway(room, full):
    assert room.full is full


@pytest.mark.parametrize(
    ("tier", "is_open", "forced", "hold", "room", "admitted"),
    [
        ("SP", True, False, HOLD_WHEN_FULL, FULL, True),  # open: everything
        ("RT", False, True, HOLD_ALL, FULL, True),  # RT always
        ("SP", False, False, HOLD_WHEN_FULL, FULL, False),  # closed, and it would wait anyway
        ("BK", False, False, HOLD_WHEN_FULL, Room(4, 0, 3), True),  # closed, but it would start
        ("BK", False, False, HOLD_WHEN_FULL, None, True),  # closed, room not known
        ("BK", False, False, HOLD_ALL, Room(4, 2, 0), False),  # the literal pause holds all but RT
        ("HP", False, True, HOLD_WHEN_FULL, Room(4, 2, 0), False),  # so does an operator's closure
    ],
)
def test_what_a_closed_admission_holds(tier, is_open, forced, hold, room, admitted):
    assert admits(tier, is_open, forced=forced, hold=hold, room=room) is admitted
    # The room is read only where it can change the answer.
    needed = weighs_room(tier, is_open, forced=forced, hold=hold)
    assert needed is (tier != "RT" and not is_open and not forced and hold == HOLD_WHEN_FULL)
    if not needed:
        assert admits(tier, is_open, forced=forced, hold=hold, room=None) is admitted


def standing(rank: int, level: int = 0, promoted: bool = False, gpus: int = 1) -> Standing:
    return Standing(rank=rank, level=level, user_share_gpu_s=0.0, submitted=0.0, promoted=promoted, gpus=gpus)


@pytest.mark.parametrize(
    ("queued", "rank", "ahead"),
    [
        ([standing(1, gpus=3)], 2, 3),  # new HP work starts before a new SP job
        ([standing(1, gpus=3)], 1, 0),  # its own class: left out (holds less)
        ([standing(1, gpus=3)], 0, 0),  # nor is anything ahead of RT but RT
        ([standing(0, level=1, gpus=5)], 4, 0),  # served work sinks below any new job
        ([standing(3, promoted=True, gpus=2)], 4, 2),  # promoted into a more urgent tier
        ([standing(4, promoted=True, gpus=2)], 4, 0),  # promoted into its own tier: behind its own
        ([standing(0), standing(1, gpus=2), standing(2, level=2, gpus=7), standing(3, gpus=4)], 3, 3),
    ],
)
def test_gpus_ahead_of_a_new_job_are_those_of_queued_work_in_a_better_class(queued, rank, ahead):
    assert gpus_ahead(rank, queued) == ahead


def test_a_cluster_counts_a_batchs_earlier_jobs_ahead_of_its_later_ones():
    cluster = Cluster(gpus=2, free_gpus=0, queued=(standing(1),))
    assert cluster.room(2) == Room(2, 0, 1) and not cluster.room(2).full
    after = cluster.with_queued(1).with_queued(2, gpus=3)
    assert after.room(2) == Room(2, 0, 2) and after.room(2).full
    assert after.room(3).gpus_ahead == 5 and after.room(1).gpus_ahead == 0


def test_the_notes_say_why_a_job_is_held_and_when_it_is_queued():
    assert held_note(FULL) == (
        "the cluster is full for it: no GPU is free, and new work of more urgent tiers already waits for "
        "4 GPU(s) (the cluster has 4)"
    )
    assert release_note(forced=False, hold=HOLD_WHEN_FULL) == (
        "it is queued at the first forecast at which it would start, or when admission reopens"
    )
    assert release_note(forced=True, hold=HOLD_WHEN_FULL) == release_note(forced=False, hold=HOLD_ALL)
    assert release_note(forced=False, hold=HOLD_ALL) == "it is queued when admission reopens"


def test_closed_note_names_the_forecast_and_the_threshold():
    assert closed_note(None, 0.91, T) == "admission closed (forecast 91% > 85%)"
    assert closed_note(None, 0.8, T) == "admission closed (forecast 80%, not yet below 75% since it passed 85%)"
    assert closed_note("oscar", 0.1, T) == "admission closed by oscar"
    assert closed_note(None, None, T) == "admission closed"


def test_pct_shows_enough_digits_to_differ_from_the_threshold():
    assert pct(0.91, 0.85) == "91%"
    assert pct(0.851, 0.85) == "85.1%"
    assert pct(0.85, 0.85) == "85%"


@pytest.mark.parametrize(
    ("changes", "field", "says"),
    [
        ({"reopen_below": 0.85}, "reopen_below", "must be below close_above"),
        ({"reopen_below": 0.9}, "reopen_below", "flap"),
        ({"reopen_below": 0.0}, "reopen_below", "above 0"),
        ({"close_above": float("nan")}, "close_above", "must be a number"),
        ({"prefetch_off_above": 0.3}, "prefetch_off_above", "must be above prefetch_below"),
        ({"prefetch_below": 0.8, "prefetch_off_above": 0.9}, "prefetch_off_above", "below close_above"),
        ({"max_workers": 0}, "max_workers", "at least 1"),
        ({"scale_out_above": -1}, "scale_out_above", "above 0"),
        ({"hold": "some"}, "hold", "hold must be one of when-full, all, not 'some'"),
    ],
)
def test_threshold_problems(changes, field, says):
    problems = threshold_problems(Thresholds(**changes))
    assert any(p.field == field and says in p.message for p in problems), problems


def test_the_defaults_have_no_problems():
    assert threshold_problems(T) == []
    assert threshold_problems(Thresholds(close_above=1.2, reopen_below=1.0)) == []
