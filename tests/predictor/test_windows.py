"""Windowing arithmetic: horizons in samples, padding, window/target alignment, splits."""

import numpy as np
import pytest

from predictor.evaluation import MIN_PART, split_windows
from predictor.series import (
    WINDOW,
    Scaler,
    SeriesError,
    horizon_steps,
    make_windows,
    pad_features,
    parse_duration,
    window_count,
)


def test_durations_and_horizon_steps():
    assert parse_duration("60s") == 60 and parse_duration("15m") == 900 and parse_duration("1h") == 3600
    assert parse_duration("300") == 300 and parse_duration("1min") == 60
    assert horizon_steps(60, 900) == 15
    assert horizon_steps(300, 900) == 3
    assert horizon_steps(30, 900) == 30
    for bad in ("0s", "-5s", "abc", "5 parsecs"):
        with pytest.raises(SeriesError):
            parse_duration(bad)
    with pytest.raises(SeriesError, match="whole multiple"):
        horizon_steps(420, 900)
    with pytest.raises(SeriesError, match="positive"):
        horizon_steps(0, 900)


def test_padding_repeats_features_in_order():
    a, b = np.arange(4.0), np.arange(4.0) * 10
    assert pad_features([a]).tolist() == np.stack([a, a, a], axis=1).tolist()
    assert pad_features([a, b]).tolist() == np.stack([a, b, a], axis=1).tolist()
    with pytest.raises(SeriesError):
        pad_features([a, b, a, b])
    with pytest.raises(SeriesError):
        pad_features([])


def test_window_and_target_alignment():
    n, steps = 40, 3
    rows = np.arange(n, dtype=np.float64)
    windows = make_windows(pad_features([rows]), rows * 100, steps)
    assert len(windows) == window_count(n, steps) == n - WINDOW - steps + 1
    assert windows.x.shape == (len(windows), WINDOW, 3)
    # Window i covers rows i..i+9; its "now" is row i+9 of the target and its future row i+9+steps.
    assert windows.x[0, :, 0].tolist() == list(range(WINDOW))
    assert windows.now[0] == (WINDOW - 1) * 100
    assert windows.future[0] == (WINDOW - 1 + steps) * 100
    assert windows.future[-1] == (n - 1) * 100  # the last row is the last target


def test_too_few_rows():
    with pytest.raises(SeriesError, match="too few rows"):
        make_windows(np.zeros((12, 3)), np.zeros(12), 3)


def test_split_is_time_ordered_with_gaps_that_no_window_straddles():
    n, steps = 600, 15
    rows = np.arange(n, dtype=np.float64)
    split = split_windows(make_windows(pad_features([rows]), rows, steps), steps)
    assert split.gap == steps + WINDOW - 1
    for earlier, later in ((split.train, split.val), (split.val, split.test)):
        # The earlier part's last target row comes before the later part's first input row.
        last_target_row = earlier.end[-1] + steps
        first_input_row = later.end[0] - (WINDOW - 1)
        assert last_target_row < first_input_row
    sizes = len(split.train), len(split.val), len(split.test)
    assert sizes[0] > sizes[1] > 0 and min(sizes) >= MIN_PART
    with pytest.raises(SeriesError, match="too few rows"):
        split_windows(make_windows(pad_features([rows[:120]]), rows[:120], steps), steps)


def test_scaler_uses_training_statistics_only():
    rows = np.arange(100, dtype=np.float64)
    windows = make_windows(pad_features([rows]), rows, 2)
    train = windows.take(0, 50)
    scaler = Scaler.fit(train)
    assert np.allclose(scaler.x_mean, train.x.reshape(-1, 3).mean(axis=0))
    assert scaler.y_mean == pytest.approx(2.0) and scaler.y_std == 1.0  # a constant change: no division by 0
    assert np.allclose(scaler.forecast(scaler.delta(train.future, train.now), train.now), train.future)
