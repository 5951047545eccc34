"""The live predictor: training on the stored load history, and the forecast that drives the
control state. The Celery tasks in predictor/tasks.py call `train` and `forecast_and_apply`.

- **Training** (`train`, hourly by default): the last CLOCKQ_PREDICTOR_HISTORY_DAYS of load
  samples (clockq.forecasting.forecasts.training_history), cut into windows per gap-free segment, split
  in time order with a gap (predictor.evaluation.split_windows), persistence, linear and the LSTM
  fitted (fixed seed, early stopping, a time budget), the champion chosen on validation MAE by
  predictor.evaluation.select_champion (never worse than persistence), the linear model and the
  LSTM saved as versioned files under CLOCKQ_MODEL_DIR with a ModelVersion row each. With too
  little history nothing is trained; the reason is logged and returned.
- **Forecast** (`forecast_and_apply`, every minute by default): the newest WINDOW samples, the
  champion (loaded once per ModelVersion and kept in this process, served through the compiled
  call), else persistence with the reason; the forecast is recorded, then applied to the control
  state with the live GPU worker count, and a changed desired count goes to the scale-out hook.

TensorFlow loads only when an LSTM is trained or loaded (predictor.forecasters imports it
lazily): importing this module, as every Celery process does through task autodiscovery, does
not load it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import redis
from django.conf import settings
from django.utils import timezone

from clockq.bus import heartbeat
from clockq.control_state import control, scale_hook
from clockq.forecasting import forecasts
from clockq.forecasting.models import ModelVersion
from clockq.policy import control as rules
from clockq.policy.load import CAP
from predictor.evaluation import FRACTIONS, MIN_PART, Split, metrics, select_champion, split_windows
from predictor.series import WINDOW, Scaler, SeriesError, Windows, horizon_steps, make_windows

log = logging.getLogger("clockq.predictor")

SEED = 0
LINEAR_FORMAT_VERSION = 1
_LINEAR_FILE = re.compile(r"^linear-v(\d+)\.json$")


def steps() -> int:
    """The horizon (15 min) in load samples; SeriesError when the interval does not divide it."""
    return horizon_steps(forecasts.interval_s(), forecasts.HORIZON_S)


def required_samples(n_steps: int) -> int:
    """Samples training needs: the setting, and at least what the time-ordered split needs for
    MIN_PART windows in each part after its two gaps."""
    gap = n_steps + WINDOW - 1
    windows = 2 * gap + math.ceil(MIN_PART / min(FRACTIONS))
    return max(settings.CLOCKQ_PREDICTOR_MIN_SAMPLES, windows + WINDOW + n_steps - 1)


def history_windows(history: forecasts.History, n_steps: int) -> Windows | None:
    """Windows cut per gap-free segment, in time order (no window spans a gap)."""
    parts = []
    for seg in np.unique(history.segment):
        idx = np.flatnonzero(history.segment == seg)
        if len(idx) < WINDOW + n_steps:
            continue
        w = make_windows(history.features[idx], history.target[idx], n_steps)
        w.end = w.end + idx[0]
        parts.append(w)
    if not parts:
        return None
    return Windows(
        x=np.concatenate([p.x for p in parts]),
        now=np.concatenate([p.now for p in parts]),
        future=np.concatenate([p.future for p in parts]),
        end=np.concatenate([p.end for p in parts]),
    )


# --- the linear model's file -------------------------------------------------------------------


def save_linear(model: Any, directory: Path) -> Path:
    """`linear-vNNNN.json` (scaler and weights), written under a temporary name and renamed."""
    directory.mkdir(parents=True, exist_ok=True)
    versions = [int(m.group(1)) for p in directory.iterdir() if (m := _LINEAR_FILE.match(p.name))]
    version = max(versions, default=0) + 1
    path = directory / f"linear-v{version:04d}.json"
    tmp = directory / f".tmp-{os.getpid()}-{path.name}"
    tmp.write_text(
        json.dumps(
            {
                "format": LINEAR_FORMAT_VERSION,
                "version": version,
                "window": WINDOW,
                "ridge": model.ridge,
                "scaler": model.scaler.to_dict(),
                "weights": model.weights.tolist(),
            }
        )
    )
    os.replace(tmp, path)
    return path


class ServedLinear:
    """A saved linear model, with the LSTM's `forecast(window, now)` serving call."""

    def __init__(self, path: Path):
        from predictor.forecasters import Linear

        data = json.loads(Path(path).read_text())
        if data.get("format") != LINEAR_FORMAT_VERSION:
            raise ValueError(f"{path}: linear format {data.get('format')!r}, this code reads {LINEAR_FORMAT_VERSION}")
        self.model = Linear(ridge=float(data["ridge"]))
        self.model.scaler = Scaler.from_dict(data["scaler"])
        self.model.weights = np.asarray(data["weights"], dtype=np.float64)

    def forecast(self, window: np.ndarray, now: float) -> float:
        x = np.asarray(window, dtype=np.float32)[None, :, :]
        one = Windows(x=x, now=np.asarray([now]), future=np.asarray([now]), end=np.asarray([WINDOW - 1]))
        return float(self.model.predict(one)[0])


# --- training --------------------------------------------------------------------------------


def train(now: datetime | None = None) -> dict[str, Any]:
    """One training run (see the module's docstring). Returns a report: `trained` and, when not,
    `reason`; else the chosen model, the validation and test metrics and the ModelVersion ids."""
    started = time.perf_counter()
    data = _training_data(now)
    if isinstance(data, str):
        return _skipped(data)
    history, split = data
    fitted, lstm_error = _fit(split)
    val = {name: metrics(model.predict(split.val), split.val.future) for name, model in fitted.items()}
    test = {name: metrics(model.predict(split.test), split.test.future) for name, model in fitted.items()}
    chosen = select_champion({name: m["mae"] for name, m in val.items()})
    seconds = time.perf_counter() - started
    rows = _model_versions(
        fitted, lstm_error, split=split, val=val, test=test, chosen=chosen, samples=len(history), seconds=seconds
    )
    winner = forecasts.record_models(rows, chosen)
    log.info(
        "train predictor: %s samples, validation MAE persistence %.4f linear %.4f lstm %s; champion %s (%.1f s)",
        len(history),
        val["persistence"]["mae"],
        val["linear"]["mae"],
        f"{val['lstm']['mae']:.4f}" if "lstm" in val else "-",
        chosen,
        seconds,
    )
    return {
        "trained": True,
        "chosen": chosen,
        "champion_id": winner.pk if winner else None,
        "model_ids": [r.pk for r in rows],
        "validation": val,
        "test": test,
        "samples": len(history),
        "seconds": round(seconds, 3),
    }


def _training_data(now: datetime | None) -> tuple[forecasts.History, Split] | str:
    """The history and its windows split into train, validation and test; or why there are none."""
    try:
        n_steps = steps()
    except SeriesError as exc:
        return f"cannot forecast 15 min ahead at this sample interval: {exc}"
    history = forecasts.training_history(now=now)
    needed = required_samples(n_steps)
    if len(history) < needed:
        return f"only {len(history)} samples of history, {needed} needed"
    windows = history_windows(history, n_steps)
    if windows is None:
        return f"no gap-free run of {WINDOW + n_steps} samples in the history"
    try:
        return history, split_windows(windows, n_steps)
    except SeriesError as exc:
        return str(exc)


def _fit(split: Split) -> tuple[dict[str, Any], str]:
    """The baseline, the linear model and the LSTM, fitted; the LSTM left out, and why, if its fit failed."""
    from predictor.forecasters import Linear, Lstm, Persistence

    persistence, linear = Persistence(), Linear()
    linear.fit(split.train, split.val)
    lstm = Lstm(seed=SEED, max_seconds=settings.CLOCKQ_TRAIN_BUDGET_S)
    lstm_error = ""
    try:
        lstm.fit(split.train, split.val)
    except Exception as exc:  # a broken fit must not cost the linear model and the baseline
        log.exception("train predictor: the LSTM failed to train")
        lstm_error = f"the LSTM failed to train: {exc}"
    fitted: dict[str, Any] = {"persistence": persistence, "linear": linear}
    if not lstm_error:
        fitted["lstm"] = lstm
    return fitted, lstm_error


def _model_versions(
    fitted: dict[str, Any],
    lstm_error: str,
    *,
    split: Split,
    val: dict[str, Any],
    test: dict[str, Any],
    chosen: str,
    samples: int,
    seconds: float,
) -> list[ModelVersion]:
    """The linear model and the LSTM (unless it failed) saved to files, as unsaved ModelVersion rows."""
    from predictor.forecasters import save_model

    directory = Path(settings.CLOCKQ_MODEL_DIR)
    common = dict(
        train_windows=len(split.train),
        validation_windows=len(split.val),
        test_windows=len(split.test),
        samples=samples,
        persistence_mae=val["persistence"]["mae"],
        linear_mae=val["linear"]["mae"],
        test_metrics=test,
        training_seconds=round(seconds, 3),
    )
    rows = [
        ModelVersion(
            kind="linear",
            path=str(save_linear(fitted["linear"], directory)),
            validation_mae=val["linear"]["mae"],
            **common,
        )
    ]
    if lstm_error:
        rows[0].notes = lstm_error
        return rows
    lstm = fitted["lstm"]
    _version, path = save_model(
        lstm,
        directory,
        metadata={"validation": val, "test": test, "chosen": chosen, "samples": samples},
    )
    rows.append(
        ModelVersion(
            kind="lstm",
            path=str(path),
            validation_mae=val["lstm"]["mae"],
            notes=f"{lstm.epochs_run} epochs"
            + (" (stopped by the time budget)" if lstm.stopped_by_budget else "")
            + f", LSTM fit {lstm.train_seconds:.1f} s",
            **common,
        )
    )
    return rows


def _skipped(reason: str) -> dict[str, Any]:
    log.info("train predictor: nothing trained: %s", reason)
    return {"trained": False, "reason": reason}


# --- serving ---------------------------------------------------------------------------------

# The champion, loaded once in this process: {ModelVersion id: model with forecast(window, now)}.
_LOADED: dict[int, Any] = {}


def served_model(version: ModelVersion) -> Any:
    model = _LOADED.get(version.pk)
    if model is None:
        if version.kind == "lstm":
            from predictor.forecasters import load_model

            model, _sidecar = load_model(version.path)
        else:
            model = ServedLinear(Path(version.path))
        _LOADED.clear()  # keep one: the champion changes at most hourly
        _LOADED[version.pk] = model
    return model


@dataclass
class Made:
    """A forecast before it is recorded."""

    value: float
    model: str
    reason: str
    version: ModelVersion | None = None
    latency_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def make_forecast(recent: forecasts.History) -> Made:
    """The champion's forecast from the newest samples, or persistence with the reason."""
    current = float(recent.target[-1])
    champ = forecasts.champion()
    if champ is None:
        return Made(current, "persistence", "persistence: " + _why_no_champion())
    if len(recent) < WINDOW or len(set(recent.segment.tolist())) != 1:
        return Made(
            current, "persistence", f"persistence: fewer than {WINDOW} consecutive load samples (a gap in the history)"
        )
    try:
        model = served_model(champ)
        started = time.perf_counter()
        value = model.forecast(recent.features[-WINDOW:], current)
        latency = (time.perf_counter() - started) * 1000.0
    except Exception as exc:
        log.exception("forecast: model %s (%s) could not serve", champ.pk, champ.kind)
        return Made(current, "persistence", f"persistence: model {champ.pk} ({champ.kind}) failed: {exc}"[:500])
    if not math.isfinite(value):
        return Made(current, "persistence", f"persistence: model {champ.pk} ({champ.kind}) gave {value}")
    clamped = min(max(value, 0.0), CAP)
    note = "" if clamped == value else f" (clamped from {value:.3f})"
    return Made(
        clamped,
        champ.kind,
        f"{champ.kind} model {champ.pk}: validation MAE {champ.validation_mae:.4f} against persistence's "
        f"{champ.persistence_mae:.4f}{note}",
        version=champ,
        latency_ms=round(latency, 3),
    )


def _why_no_champion() -> str:
    try:
        needed = required_samples(steps())
    except SeriesError as exc:
        return f"no model can be trained at this sample interval ({exc})"
    have = forecasts.sample_count()
    if have < needed:
        return f"only {have} samples of history, {needed} needed"
    latest = ModelVersion.objects.order_by("-created_at", "-id").first()
    if latest is None:
        return "no model trained yet"
    return (
        f"the latest training (model {latest.pk}) found no model better than persistence on validation "
        f"(persistence MAE {latest.persistence_mae:.4f})"
    )


def live_gpu_workers() -> int:
    return sum(1 for w in heartbeat.live_workers() if w.get("gpu") is not None)


def forecast_and_apply(now: datetime | None = None) -> dict[str, Any] | None:
    """Forecast, record it, apply it to the control state, ask for scale-out when the desired
    count changed. Returns what was done; None when there was no fresh load sample to forecast
    from (logged)."""
    at = now or timezone.now()
    recent = forecasts.recent_history(WINDOW)
    input_at = recent.last_at()
    if input_at is None:
        log.info("forecast: no load sample yet, nothing to forecast from")
        return None
    max_age = max(forecasts.STALE_AFTER_S, 3 * forecasts.interval_s())
    age = (at - input_at).total_seconds()
    if age > max_age:
        log.warning("forecast: skipped, the newest load sample is %.0f s old (more than %s s)", age, max_age)
        return None
    made = make_forecast(recent)
    row = forecasts.record_forecast(
        value=made.value,
        model=made.model,
        reason=made.reason,
        at=at,
        version=made.version,
        input_at=input_at,
        latency_ms=made.latency_ms,
    )
    result: dict[str, Any] = {"forecast": made.value, "model": made.model, "reason": made.reason, "id": row.pk}
    try:
        workers = live_gpu_workers()
    except redis.RedisError as exc:
        log.warning("forecast %.3f recorded but not applied: cannot count the GPU workers (%s)", made.value, exc)
        result["applied"] = False
        return result
    # Persistence moves admission only after a warm-up: the control rules weigh what it stands on.
    samples = forecasts.sample_count() if made.model == rules.PERSISTENCE else 0
    decisions = control.apply_forecast(made.value, at, workers=workers, basis=rules.Basis(made.model, samples))
    scale_hook.request_scale_out(decisions, current=workers, forecast=made.value)
    forecasts.prune_forecasts(now=at)
    result.update(applied=True, workers=workers, changes=[d.reason for d in decisions])
    return result
