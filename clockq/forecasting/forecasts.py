"""The load forecasts and the predictor's models, as the core stores them.

The predictor (predictor/tasks.py) reads its training history and its input window here, records
each forecast and each trained model here, and asks which model is the champion. The dashboard
and /healthz read the forecasts back. No TensorFlow here: arrays are numpy.

History as arrays: MetricSample rows in time order, the features (cpu, gpu_util, memory) and the
target (load_index). A sample without a load index (no GPU worker was alive) is left out; a
missing feature (no telemetry in that sample) takes the previous sample's value, or 0 at the
start. Samples further apart than 1.5 intervals start a new *segment*: a window never spans a
gap in the history (predictor/live.py cuts windows per segment).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clockq.forecasting.models import Forecast, MetricSample, ModelVersion

FEATURE_FIELDS = ("cpu", "gpu_util", "memory")
TARGET_FIELD = "load_index"
HORIZON_S = 15 * 60  # the specification's horizon: 15 minutes ahead
STALE_AFTER_S = 300  # a forecast older than this is stale (the refresh must be at least this often)
GAP_FACTOR = 1.5  # samples further apart than this many intervals are not consecutive


@dataclass
class History:
    """Load samples as arrays, oldest first."""

    at: np.ndarray  # (n,) epoch seconds
    features: np.ndarray  # (n, 3): cpu, gpu_util, memory
    target: np.ndarray  # (n,): load_index
    segment: np.ndarray  # (n,) int: samples with the same number follow each other without a gap

    def __len__(self) -> int:
        return len(self.target)

    def last_at(self) -> datetime | None:
        if not len(self):
            return None
        return datetime.fromtimestamp(float(self.at[-1]), tz=timezone.get_current_timezone())


def interval_s() -> int:
    """The load history's sample interval (the setting the load-sample task was created with)."""
    return settings.CLOCKQ_LOAD_SAMPLE_EVERY_S


def _history(rows: list[tuple], interval: float) -> History:
    n = len(rows)
    at = np.empty(n, dtype=np.float64)
    features = np.zeros((n, len(FEATURE_FIELDS)), dtype=np.float64)
    target = np.empty(n, dtype=np.float64)
    last = [0.0] * len(FEATURE_FIELDS)
    for i, (when, *values) in enumerate(rows):
        at[i] = when.timestamp()
        *feats, load = values
        for j, value in enumerate(feats):
            if value is not None:
                last[j] = float(value)
            features[i, j] = last[j]
        target[i] = float(load)
    gaps = np.diff(at) > GAP_FACTOR * interval if n else np.zeros(0, dtype=bool)
    segment = np.concatenate([[0], np.cumsum(gaps)]).astype(np.int64) if n else np.zeros(0, dtype=np.int64)
    return History(at=at, features=features, target=target, segment=segment)


def _rows(queryset, cap: int | None = None) -> list[tuple]:
    qs = queryset.filter(load_index__isnull=False).values_list("at", *FEATURE_FIELDS, TARGET_FIELD)
    return list(qs if cap is None else qs[:cap])


def training_history(days: int | None = None, now: datetime | None = None) -> History:
    """The last `days` (CLOCKQ_PREDICTOR_HISTORY_DAYS) of load samples, oldest first."""
    days = settings.CLOCKQ_PREDICTOR_HISTORY_DAYS if days is None else days
    since = (now or timezone.now()) - timedelta(days=days)
    return _history(_rows(MetricSample.objects.filter(at__gte=since).order_by("at")), interval_s())


def recent_history(count: int) -> History:
    """The newest `count` load samples (with a load index), oldest first."""
    rows = _rows(MetricSample.objects.order_by("-at"), cap=count) if count > 0 else []
    rows.reverse()
    return _history(rows, interval_s())


def sample_count() -> int:
    return MetricSample.objects.filter(load_index__isnull=False).count()


# --- models ----------------------------------------------------------------------------------


def champion() -> ModelVersion | None:
    """The model that serves; None: persistence."""
    return ModelVersion.objects.filter(is_champion=True).order_by("-created_at", "-id").first()


def record_models(rows: list[ModelVersion], chosen: str) -> ModelVersion | None:
    """Store one training run's models and make the one of kind `chosen` the champion (none when
    `chosen` is persistence: the previous champion steps down too, since it lost to persistence
    on the latest data, or there is no fair comparison any more). Returns the champion row."""
    winner = None
    with transaction.atomic():
        ModelVersion.objects.filter(is_champion=True).update(is_champion=False)
        for row in rows:
            row.chosen = chosen
            row.is_champion = row.kind == chosen
            row.save()
            if row.is_champion:
                winner = row
    return winner


# --- forecasts -------------------------------------------------------------------------------


def record_forecast(
    *,
    value: float,
    model: str,
    reason: str,
    at: datetime | None = None,
    horizon_s: int = HORIZON_S,
    version: ModelVersion | None = None,
    input_at: datetime | None = None,
    latency_ms: float | None = None,
) -> Forecast:
    return Forecast.objects.create(
        at=at or timezone.now(),
        horizon_s=horizon_s,
        value=float(value),
        model=model,
        version=version,
        reason=reason[:2000],
        input_at=input_at,
        latency_ms=latency_ms,
    )


def latest_forecast() -> Forecast | None:
    return Forecast.objects.order_by("-at", "-id").first()


def forecast_series(since: datetime, until: datetime | None = None, cap: int = 5000) -> list[dict[str, Any]]:
    """Forecasts made in [since, until], oldest first: when made, for when, value, model."""
    qs = Forecast.objects.filter(at__gte=since)
    if until is not None:
        qs = qs.filter(at__lte=until)
    rows = list(qs.order_by("-at", "-id").values("at", "horizon_s", "value", "model", "reason")[:cap])
    rows.reverse()
    return rows


def load_series(since: datetime, until: datetime | None = None, cap: int = 5000) -> list[dict[str, Any]]:
    """The load index of the samples in [since, until], oldest first."""
    qs = MetricSample.objects.filter(at__gte=since)
    if until is not None:
        qs = qs.filter(at__lte=until)
    rows = list(qs.order_by("-at").values("at", "load_index", "gpu_util", "cpu", "memory")[:cap])
    rows.reverse()
    return rows


def forecast_health(now: datetime | None = None) -> dict[str, Any]:
    """How fresh the forecast is, for /healthz: `status` ok (made in the last STALE_AFTER_S),
    stale (older), or waiting (none yet, and the load history is younger than STALE_AFTER_S:
    a fresh stack has had no time to forecast). No forecast while load samples are older than
    that is stale too: the predictor is not running."""
    now = now or timezone.now()
    latest = latest_forecast()
    if latest is not None:
        age = (now - latest.at).total_seconds()
        return {
            "ok": age <= STALE_AFTER_S,
            "status": "ok" if age <= STALE_AFTER_S else "stale",
            "age_s": round(age, 1),
            "value": latest.value,
            "model": latest.model,
            "stale_after_s": STALE_AFTER_S,
        }
    first = MetricSample.objects.order_by("at").values_list("at", flat=True).first()
    if first is not None and (now - first).total_seconds() > STALE_AFTER_S:
        return {
            "ok": False,
            "status": "stale",
            "age_s": None,
            "note": f"no forecast yet, though load samples exist since {first.isoformat()}",
            "stale_after_s": STALE_AFTER_S,
        }
    return {"ok": True, "status": "waiting", "age_s": None, "note": "no forecast yet", "stale_after_s": STALE_AFTER_S}


def prune_forecasts(keep_days: int | None = None, now: datetime | None = None) -> int:
    """Delete forecasts older than the load history's retention (CLOCKQ_LOAD_HISTORY_DAYS)."""
    days = settings.CLOCKQ_LOAD_HISTORY_DAYS if keep_days is None else keep_days
    deleted, _ = Forecast.objects.filter(at__lt=(now or timezone.now()) - timedelta(days=days)).delete()
    return deleted
