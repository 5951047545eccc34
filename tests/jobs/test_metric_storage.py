"""Metric curves in the database: what a worker saves at each checkpoint is what loads back,
however the curve grew since the last save (appended, thinned, rewound)."""

from __future__ import annotations

import json

import pytest

from clockq.jobs import metrics
from clockq.jobs.metrics import PointsText
from clockq.policy.metrics import MAX_POINTS, Series
from tests.helpers import submit

pytestmark = pytest.mark.django_db


def _grow(series: Series, steps: range) -> None:
    for step in steps:
        series.add(step, 1.0 / (step + 1))


def test_saved_curves_load_back_after_appends_thinning_and_a_rewind(alice):
    job = submit(alice, "SP", "curves")
    curves = {"loss": Series(), "lr": Series()}
    _grow(curves["loss"], range(0, 10))
    _grow(curves["lr"], range(0, 3))
    metrics.save(job.pk, curves, {"loss", "lr"})

    for steps in (range(10, 40), range(40, MAX_POINTS + 600), range(700, 720)):  # appends, a thinning, a rewind
        _grow(curves["loss"], steps)
        metrics.save(job.pk, curves, {"loss"}, stored={"loss", "lr"})
        assert metrics.load(job.pk) == curves

    assert curves["loss"].stride == 2 and curves["loss"].points[-1][0] < 720


def test_the_text_of_a_growing_curve_is_extended_and_rebuilt_when_the_list_is_replaced():
    texts, series = PointsText(), Series()
    assert texts.of(1, "loss", series.points) == "[]"
    for steps in (range(0, 1), range(1, 5), range(5, 5), range(5, 2 * MAX_POINTS)):
        _grow(series, steps)
        assert json.loads(texts.of(1, "loss", series.points)) == [list(p) for p in series.points]


def test_the_texts_kept_are_bounded():
    texts = PointsText(max_curves=2)
    for job_id in range(5):
        texts.of(job_id, "loss", [(0, 1.0)])
    assert len(texts._texts) == 2
