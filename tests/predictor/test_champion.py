"""The champion never is a model worse than persistence on validation data."""

import math

import numpy as np
import pytest

from predictor.evaluation import MIN_GAIN, buckets, improvement_pct, metrics, select_champion


def test_best_model_wins_when_clearly_better_than_persistence():
    assert select_champion({"persistence": 0.10, "linear": 0.08, "lstm": 0.07}) == "lstm"
    assert select_champion({"persistence": 0.10, "linear": 0.08, "lstm": 0.09}) == "linear"


@pytest.mark.parametrize(
    "maes",
    [
        {"persistence": 0.10, "linear": 0.12, "lstm": 0.11},  # both worse
        {"persistence": 0.10, "linear": 0.10, "lstm": 0.10},  # ties go to persistence
        {"persistence": 0.10, "linear": 0.10 * (1 - MIN_GAIN / 2), "lstm": 0.5},  # better, within noise
        {"persistence": 0.10, "linear": math.nan, "lstm": math.inf},  # diverged fits
        {"persistence": 0.0, "linear": 0.0, "lstm": 0.0},  # a constant series
        {"persistence": 0.10},
    ],
)
def test_persistence_stays_unless_beaten_by_the_margin(maes):
    assert select_champion(maes) == "persistence"


def test_never_worse_than_persistence_over_random_cases():
    rng = np.random.default_rng(11)
    for _ in range(2000):
        maes = {"persistence": float(rng.uniform(0.001, 1))}
        maes.update({name: float(rng.uniform(0, 2)) for name in ("linear", "lstm")})
        champion = select_champion(maes)
        assert maes[champion] <= maes["persistence"]
        assert maes[champion] == min(maes.values()) or champion == "persistence"


def test_persistence_is_required():
    with pytest.raises(ValueError):
        select_champion({"linear": 0.1, "lstm": 0.2})


def test_buckets_and_metrics():
    assert buckets(np.array([0.0, 0.29, 0.30, 0.70, 0.71, 0.85, 0.86, 1.7])).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    m = metrics(np.array([0.2, 0.5, 0.9]), np.array([0.2, 0.8, 0.9]))
    assert m["mae"] == pytest.approx(0.1)
    assert m["rmse"] == pytest.approx(np.sqrt(0.09 / 3))
    assert m["bucket_accuracy"] == pytest.approx(2 / 3)
    assert improvement_pct(0.09, 0.10) == pytest.approx(10.0)
