"""The LSTM learns a generated, learnable signal better than persistence, serves through its
compiled call, and survives a save and load as a versioned file."""

import numpy as np
import pytest

from predictor.evaluation import metrics, split_windows
from predictor.forecasters import Linear, Lstm, Persistence, forecast_latency_ms, load_model, model_versions, save_model
from predictor.series import make_windows, pad_features

STEPS = 12


def generated_sine(n: int = 1600, seed: int = 3) -> np.ndarray:
    """Generated data (not a real trace): a daily-like sine of period 48 samples around 0.55,
    with Gaussian noise. 12 steps ahead is a quarter period: "now" is a poor forecast of it,
    while the window holds the phase that predicts it."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return 0.55 + 0.3 * np.sin(2 * np.pi * t / 48) + 0.02 * rng.standard_normal(n)


@pytest.fixture(scope="module")
def trained():
    load = generated_sine()
    split = split_windows(make_windows(pad_features([load]), load, STEPS), STEPS)
    lstm = Lstm(seed=0, max_epochs=25, patience=4, batch_size=64, learning_rate=5e-3)
    lstm.fit(split.train, split.val)
    return lstm, split


def test_lstm_tracks_a_learnable_signal_better_than_persistence(trained):
    lstm, split = trained
    persistence = Persistence()
    lstm_mae = metrics(lstm.predict(split.test), split.test.future)["mae"]
    persistence_mae = metrics(persistence.predict(split.test), split.test.future)["mae"]
    linear = Linear()
    linear.fit(split.train, split.val)
    linear_mae = metrics(linear.predict(split.test), split.test.future)["mae"]
    assert lstm_mae < 0.5 * persistence_mae, (lstm_mae, persistence_mae)
    assert linear_mae < 0.5 * persistence_mae, (linear_mae, persistence_mae)
    assert 1 <= lstm.epochs_run <= 25


def test_serving_call_matches_batch_forecasts_and_is_traced_once(trained, monkeypatch):
    """Fast because it is compiled: `model.predict`, which builds a data pipeline on every call,
    is never used, and the call is traced once for any batch size, not at each forecast."""
    lstm, split = trained
    monkeypatch.setattr(lstm.model, "predict", lambda *a, **k: pytest.fail("served through model.predict"))
    batch = lstm.predict(split.test.take(0, 5))
    one = [lstm.forecast(split.test.x[i], float(split.test.now[i])) for i in range(5)]
    assert np.allclose(batch, one, atol=1e-5)
    latency = forecast_latency_ms(lstm, split.test.x[0], float(split.test.now[0]), repeats=50)
    assert 0 < latency["median"] <= latency["p95"]
    assert lstm._call.experimental_get_tracing_count() == 1


def test_save_and_load_versioned_files(trained, tmp_path):
    lstm, split = trained
    first, path1 = save_model(lstm, tmp_path, {"validation_mae": 0.01})
    second, path2 = save_model(lstm, tmp_path)
    assert (first, second) == (1, 2)
    assert path2.name == "lstm-v0002.keras" and path2.with_suffix(".json").is_file()
    assert [v for v, _ in model_versions(tmp_path)] == [1, 2]
    loaded, sidecar = load_model(path1)
    assert sidecar["metadata"] == {"validation_mae": 0.01} and sidecar["version"] == 1
    assert np.allclose(loaded.predict(split.test), lstm.predict(split.test), atol=1e-6)
