"""Offline evaluation: the three forecasters on held-out data, split in time order, and the
champion rule.

Pure numpy until the LSTM is fitted (`predictor.forecasters` imports TensorFlow lazily), so the
metrics, buckets, splits and champion rule can be used and tested without TensorFlow.

- **Split**: windows in time order, 70% train, 15% validation, 15% test, with a gap of
  `steps + WINDOW - 1` windows between parts. With it, no window of a later part shares a row
  with the input or the target of a window of an earlier part, so nothing of validation or test
  leaks into training through overlapping windows.
- **Fit** on train; the LSTM stops early on validation; scaling uses train statistics only.
- **Champion**: the model with the best validation MAE, provided it beats persistence's
  validation MAE by at least `MIN_GAIN` (2%); otherwise persistence. The margin is there
  because the LSTM's validation MAE is slightly optimistic (early stopping watched that same
  split) and because a gain smaller than that is within the week-to-week noise of these series:
  a forecast that is not clearly better than "now" must not steer the cluster.
- **Metrics** on test: MAE, RMSE and action-bucket accuracy (how often the forecast falls in
  the same action bucket as the real load: <0.30 prefetch, 0.30-0.70, 0.70-0.85 scale out,
  >0.85 close admission).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from predictor.series import WINDOW, SeriesError, Windows, make_windows

FRACTIONS = (0.70, 0.15, 0.15)  # train, validation, test
MIN_GAIN = 0.02  # a challenger must beat persistence's validation MAE by this fraction
MIN_PART = 20  # windows each part must hold at least, or the figures mean nothing
BUCKET_EDGES = (0.30, 0.70, 0.85)  # prefetch below, scale out above 0.70, close admission above 0.85
MODEL_NAMES = ("persistence", "linear", "lstm")


def buckets(load: np.ndarray) -> np.ndarray:
    """Action bucket of each load value: 0 (<0.30), 1 (0.30-0.70), 2 (0.70-0.85], 3 (>0.85).
    The thresholds act on "above 70%" and "above 85%", so 0.70 and 0.85 themselves fall in the
    lower bucket; 0.30 is not "below 30%", so it falls in bucket 1."""
    load = np.asarray(load, dtype=np.float64)
    low, mid, high = BUCKET_EDGES
    return np.where(load < low, 0, np.where(load <= mid, 1, np.where(load <= high, 2, 3)))


def metrics(forecast: np.ndarray, actual: np.ndarray) -> dict[str, float]:
    forecast = np.asarray(forecast, dtype=np.float64)
    actual = np.asarray(actual, dtype=np.float64)
    error = forecast - actual
    return {
        "mae": float(np.mean(np.abs(error))),
        "rmse": float(np.sqrt(np.mean(error**2))),
        "bucket_accuracy": float(np.mean(buckets(forecast) == buckets(actual))),
    }


@dataclass
class Split:
    train: Windows
    val: Windows
    test: Windows
    gap: int  # windows dropped between consecutive parts


def split_windows(windows: Windows, steps: int, fractions: tuple[float, float, float] = FRACTIONS) -> Split:
    """Train, validation and test in time order, `steps + WINDOW - 1` windows apart."""
    gap = steps + WINDOW - 1
    m = len(windows)
    usable = m - 2 * gap
    n_train = int(usable * fractions[0])
    n_val = int(usable * fractions[1])
    n_test = usable - n_train - n_val
    if min(n_train, n_val, n_test) < MIN_PART:
        needed_windows = 2 * gap + int(np.ceil(MIN_PART / min(fractions)))
        raise SeriesError(
            f"too few rows for the evaluation: {m} windows (of {WINDOW} samples, target {steps} samples ahead) "
            f"leave fewer than {MIN_PART} for a part after two gaps of {gap}; about {needed_windows + WINDOW + steps} "
            "rows are needed"
        )
    val_start = n_train + gap
    test_start = val_start + n_val + gap
    return Split(
        train=windows.take(0, n_train),
        val=windows.take(val_start, val_start + n_val),
        test=windows.take(test_start, m),
        gap=gap,
    )


def select_champion(validation_mae: dict[str, float], min_gain: float = MIN_GAIN) -> str:
    """The model with the lowest validation MAE, if it beats persistence's by at least
    `min_gain` (a fraction of it); else persistence. A missing or non-finite MAE (a diverged
    fit) disqualifies a model. Persistence must be among the candidates: it is the fallback."""
    if "persistence" not in validation_mae or not np.isfinite(validation_mae["persistence"]):
        raise ValueError("persistence's validation MAE is needed to choose a champion")
    baseline = validation_mae["persistence"]
    candidates = {name: mae for name, mae in validation_mae.items() if mae is not None and np.isfinite(mae)}
    best = min(candidates, key=lambda name: (candidates[name], name != "persistence"))
    if best != "persistence" and candidates[best] <= baseline * (1.0 - min_gain):
        return best
    return "persistence"


def improvement_pct(mae: float, baseline_mae: float) -> float:
    """How much lower `mae` is than the baseline's, in percent (negative: worse)."""
    if baseline_mae <= 0:
        return 0.0
    return 100.0 * (baseline_mae - mae) / baseline_mae


def evaluate(
    features: np.ndarray,
    target: np.ndarray,
    steps: int,
    *,
    seed: int = 0,
    max_train: int | None = None,
    lstm_options: dict[str, Any] | None = None,
    min_gain: float = MIN_GAIN,
) -> dict[str, Any]:
    """Fit persistence, linear and the LSTM on one series and score them.

    features: (n, 3) (see `predictor.series.pad_features`); target: (n,); steps: the horizon in
    samples. `max_train` keeps only the most recent training windows (a cost bound for long or
    fine-grained series; the validation and test parts are never cut).

    Returns one dict keyed by model name (`persistence`, `linear`, `lstm`, `champion`), each
    with the test split's `mae`, `rmse` and `bucket_accuracy`, plus `validation` metrics and
    fit time; `champion` also names its `model`; `split` and `lstm` carry sizes, epochs and the
    forecast latency.
    """
    from predictor.forecasters import Linear, Lstm, Persistence, forecast_latency_ms

    windows = make_windows(features, target, steps)
    split = split_windows(windows, steps)
    train = split.train
    if max_train is not None and len(train) > max_train:
        train = train.take(len(train) - max_train, len(train))

    lstm = Lstm(seed=seed, **(lstm_options or {}))
    models: dict[str, Any] = {"persistence": Persistence(), "linear": Linear(), "lstm": lstm}
    report: dict[str, Any] = {}
    test_forecasts: dict[str, np.ndarray] = {}
    for name, model in models.items():
        started = time.perf_counter()
        model.fit(train, split.val)
        fit_seconds = time.perf_counter() - started
        test_forecasts[name] = model.predict(split.test)
        report[name] = {
            **metrics(test_forecasts[name], split.test.future),
            "validation": metrics(model.predict(split.val), split.val.future),
            "fit_seconds": round(fit_seconds, 3),
        }
    report["lstm"]["epochs"] = lstm.epochs_run
    report["lstm"]["stopped_by_time_budget"] = lstm.stopped_by_budget
    report["lstm"]["latency_ms"] = forecast_latency_ms(lstm, split.test.x[-1], float(split.test.now[-1]))

    champion = select_champion({name: report[name]["validation"]["mae"] for name in models}, min_gain)
    report["champion"] = {
        **metrics(test_forecasts[champion], split.test.future),
        "model": champion,
        "validation": report[champion]["validation"],
    }
    baseline = report["persistence"]["mae"]
    for name in (*MODEL_NAMES, "champion"):
        report[name]["improvement_pct"] = round(improvement_pct(report[name]["mae"], baseline), 2)
    report["split"] = {
        "rows": len(target),
        "windows": len(windows),
        "train": len(train),
        "train_available": len(split.train),
        "validation": len(split.val),
        "test": len(split.test),
        "gap": split.gap,
        "steps": steps,
    }
    return report
