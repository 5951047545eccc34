"""Metric curves stay bounded, keep the newest value, and never show a step twice."""

from __future__ import annotations

import math

import pytest

from clockq.policy.metrics import MAX_NAMES, Series, clean


def test_short_curves_keep_every_point():
    s = Series()
    for step in range(1, 11):
        s.add(step, 1.0 / step)
    assert s.view() == [(step, 1.0 / step) for step in range(1, 11)]


@pytest.mark.parametrize("steps", [101, 1000, 12_345, 100_000])
def test_long_curves_are_thinned_evenly_and_keep_the_last_value(steps):
    s = Series()
    for step in range(1, steps + 1):
        s.add(step, float(step), max_points=100)
    view = s.view()
    assert len(view) <= 101
    assert view[-1] == (steps, float(steps))  # the newest value, always
    gaps = {b[0] - a[0] for a, b in zip(s.points, s.points[1:], strict=False)}
    assert gaps == {s.stride}  # evenly spaced
    assert view[0][0] == 1


def test_a_step_reported_again_replaces_the_points_from_there_on():
    s = Series()
    for step in range(1, 9):
        s.add(step, 10.0)
    s.add(5, 1.0)  # resumed from an older checkpoint: steps 5.. run again
    assert s.view() == [(1, 10.0), (2, 10.0), (3, 10.0), (4, 10.0), (5, 1.0)]
    steps = [p[0] for p in s.view()]
    assert len(steps) == len(set(steps))


def test_clean_refuses_what_a_program_should_not_send():
    records = [
        (1, "loss", 0.5),
        (-1, "loss", 0.5),
        (True, "loss", 0.5),
        (2, "bad name!", 1.0),
        (2, "loss", math.nan),
        (2, "loss", "0.1"),
        (3, "accuracy", 0.9),
    ]
    kept, problems = clean(records, known=set())
    assert kept == [(1, "loss", 0.5), (3, "accuracy", 0.9)]
    assert len(problems) == 5
    many = [(1, f"m{i}", 1.0) for i in range(MAX_NAMES + 3)]
    kept, problems = clean(many, known=set())
    assert len(kept) == MAX_NAMES and len(problems) == 3
