"""The live predictor on a generated load history: training writes ModelVersion rows and picks
the champion by the rule; the forecast task records a Forecast and applies it to the control
state; with too little history it is persistence, and says so."""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import pytest
from django.utils import timezone

from clockq.bus import heartbeat
from clockq.bus.client import client as broker
from clockq.control_state.models import ControlDecision, ControlState
from clockq.forecasting import forecasts
from clockq.forecasting.models import Forecast, MetricSample, ModelVersion
from predictor import live, tasks
from predictor.evaluation import select_champion
from predictor.forecasters import forecast_latency_ms

pytestmark = pytest.mark.django_db

PERIOD = 90  # samples: a learnable cycle, 1.5 hours at one sample a minute


def generated_history(n: int, *, end=None, level=None, interval_s: int = 60) -> None:
    """`n` MetricSample rows one interval apart ending at `end` (now): a cyclic load the window
    can extrapolate, with features that follow it (CPU, GPU, memory), a little noise."""
    end = end or timezone.now()
    rng = np.random.default_rng(7)
    t = np.arange(n)
    load = 0.5 + 0.35 * np.sin(2 * np.pi * t / PERIOD) + rng.normal(0, 0.01, n)
    if level is not None:
        load = np.full(n, level)
    rows = [
        MetricSample(
            at=(end - timedelta(seconds=interval_s * (n - 1 - i))).replace(microsecond=0),
            load_index=float(np.clip(load[i], 0, 2)),
            gpu_util=float(np.clip(load[i], 0, 1)),
            cpu=float(np.clip(0.3 + 0.5 * load[i], 0, 1)),
            memory=float(np.clip(0.4 + 0.2 * np.cos(2 * np.pi * t[i] / PERIOD), 0, 1)),
            gpus=4,
        )
        for i in range(n)
    ]
    MetricSample.objects.bulk_create(rows)


def gpu_workers(n: int) -> None:
    for i in range(n):
        name = f"gpu{i}@hostA"
        heartbeat.announce(broker(), {"hostname": name, "gpu": i, "host": "hostA", "pid": 1, "started": 0.0})


@pytest.fixture
def model_dir(settings, tmp_path):
    settings.CLOCKQ_MODEL_DIR = tmp_path / "models"
    settings.CLOCKQ_TRAIN_BUDGET_S = 30.0
    live._LOADED.clear()
    yield settings.CLOCKQ_MODEL_DIR
    live._LOADED.clear()


def test_too_little_history_trains_nothing_and_forecasts_persistence_saying_so(model_dir, settings):
    settings.CLOCKQ_ADMISSION_WARMUP_SAMPLES = 60
    earlier = timezone.now() - timedelta(minutes=20)
    generated_history(40, level=0.95, end=earlier)
    gpu_workers(2)

    report = tasks.train_predictor()
    assert report == {"trained": False, "reason": "only 40 samples of history, 300 needed"}
    assert not ModelVersion.objects.exists()

    result = live.forecast_and_apply(now=earlier)
    row = Forecast.objects.get()
    assert row.model == "persistence" and row.value == pytest.approx(0.95)
    assert row.reason == "persistence: only 40 samples of history, 300 needed"
    assert row.input_at is not None and row.horizon_s == 900
    # Applied: 95% is above the 70% scale-out threshold, and above the 85% admission threshold,
    # but admission leaves persistence alone until the warm-up's 60 samples are kept.
    state = ControlState.objects.get()
    assert state.forecast == pytest.approx(0.95) and state.admission_open
    assert "persistence, acted on only once 60 load samples are kept (40 so far)" in state.reason
    assert state.desired_workers == 3  # ceil(2 * 0.95 / 0.70)
    assert not ControlDecision.objects.filter(what="admission_open").exists()
    assert result["applied"] and result["workers"] == 2

    # Once 60 samples are kept, the same persistence forecast closes admission.
    generated_history(20, level=0.95)
    assert tasks.forecast()["applied"]
    state = ControlState.objects.get()
    assert not state.admission_open
    assert ControlDecision.objects.filter(what="admission_open", new="false", actor="controller").exists()


def test_no_fresh_sample_no_forecast(model_dir):
    generated_history(20, end=timezone.now() - timedelta(hours=1))
    assert tasks.forecast() is None
    assert not Forecast.objects.exists() and not ControlState.objects.exists()


def test_a_failure_is_logged_and_the_next_tick_runs(model_dir, monkeypatch, caplog):
    generated_history(20, level=0.5)
    gpu_workers(1)
    monkeypatch.setattr(live.control, "apply_forecast", lambda *a, **k: 1 / 0)
    assert tasks.forecast() is None
    assert "forecast failed" in caplog.text
    monkeypatch.undo()
    assert tasks.forecast()["applied"]
    assert Forecast.objects.count() == 2


def test_training_on_generated_history_picks_a_champion_by_the_rule_and_the_forecast_serves_it(model_dir):
    generated_history(720)  # 12 hours at one sample a minute
    gpu_workers(4)

    started = time.perf_counter()
    report = tasks.train_predictor()
    seconds = time.perf_counter() - started
    print(f"training on 720 generated samples: {seconds:.1f} s")
    assert report["trained"], report
    rows = {r.kind: r for r in ModelVersion.objects.all()}
    assert set(rows) == {"linear", "lstm"}
    val = report["validation"]
    assert report["chosen"] == select_champion({name: m["mae"] for name, m in val.items()})
    # The cycle is learnable: the champion beats persistence, which it must never be worse than.
    assert report["chosen"] != "persistence"
    assert val[report["chosen"]]["mae"] <= 0.98 * val["persistence"]["mae"]
    champion = ModelVersion.objects.get(is_champion=True)
    assert champion.kind == report["chosen"] and champion.pk == report["champion_id"]
    for row in rows.values():
        assert row.chosen == report["chosen"] and row.persistence_mae == pytest.approx(val["persistence"]["mae"])
        assert row.validation_windows >= 20 and row.train_windows > row.validation_windows
        assert (model_dir / row.path.rsplit("/", 1)[-1]).is_file()
        assert set(row.test_metrics) >= {"persistence", "linear"}
    assert rows["lstm"].validation_mae == pytest.approx(val["lstm"]["mae"])

    result = tasks.forecast()
    row = Forecast.objects.get()
    assert row.model == champion.kind and row.version_id == champion.pk
    assert row.reason.startswith(f"{champion.kind} model {champion.pk}: validation MAE")
    state = ControlState.objects.get()
    assert state.forecast == pytest.approx(row.value) and result["applied"]

    # The LSTM serves (the champion or not) through the compiled call, traced once.
    lstm = live.served_model(rows["lstm"])
    recent = forecasts.recent_history(10)
    latency = forecast_latency_ms(lstm, recent.features, float(recent.target[-1]), repeats=50)
    print(f"LSTM forecast latency through the compiled call: median {latency['median']:.2f} ms")
    assert lstm._call.experimental_get_tracing_count() == 1


def test_a_later_training_that_picks_persistence_retires_the_champion(model_dir):
    a = ModelVersion.objects.create(kind="linear", path="x", validation_mae=0.1, persistence_mae=0.2)
    forecasts.record_models([a], "linear")
    assert forecasts.champion() == a
    b = ModelVersion(kind="linear", path="y", validation_mae=0.3, persistence_mae=0.2)
    assert forecasts.record_models([b], "persistence") is None
    assert forecasts.champion() is None and not ModelVersion.objects.filter(is_champion=True).exists()


def test_gaps_split_the_history_into_segments():
    from datetime import UTC, datetime

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [(t0 + timedelta(seconds=60 * i), 0.1, 0.2, None, 0.5) for i in (0, 1, 2, 10, 11)]
    history = forecasts._history(rows, 60)
    assert history.segment.tolist() == [0, 0, 0, 1, 1]
    assert history.features[:, 2].tolist() == [0.0] * 5  # no memory reading: 0


def test_when_training_chose_persistence_the_forecast_says_so(model_dir):
    generated_history(320, level=0.5)
    row = ModelVersion(kind="linear", path="unused", validation_mae=0.3, persistence_mae=0.2)
    forecasts.record_models([row], "persistence")
    tasks.forecast()
    forecast = Forecast.objects.get()
    assert forecast.model == "persistence" and forecast.version is None
    assert forecast.reason == (
        f"persistence: the latest training (model {row.pk}) found no model better than persistence on "
        "validation (persistence MAE 0.2000)"
    )
