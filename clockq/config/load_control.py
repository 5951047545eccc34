"""Load control and the KPIs: the KPIs' price and retention, admission's thresholds, the load
history, the live predictor and the scale-out hook."""

from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from clockq.config.paths import VAR_DIR
from clockq.env import env_choice, env_float, env_int, env_str, parse_scale_hook
from clockq.policy import control as _control

# KPIs (/api/kpis): the price of one GPU-hour, busy or idle, for the cost per useful GPU-hour;
# and how long the per-minute rollup rows are kept.
CLOCKQ_GPU_HOUR_PRICE = env_float("CLOCKQ_GPU_HOUR_PRICE", 2.5, min_value=0.0, max_value=1_000_000.0)
CLOCKQ_KPI_RETENTION_DAYS = env_int("CLOCKQ_KPI_RETENTION_DAYS", 90, min_value=1, max_value=3650)
# Load control (clockq/policy/control.py): admission closes when the forecast load index passes
# CLOSE_ABOVE and reopens only below REOPEN_BELOW (the gap keeps it from flapping); while it is
# closed, HOLDS says which new jobs are held: "when-full", only a job that would wait anyway (no
# GPU free, and more urgent new work already queued for every GPU), or "all", every new job but
# RT until it reopens (the specification's literal pause, which costs completion time: see
# docs/predictor.md). Scale-out never asks for more than CLOCKQ_MAX_GPU_WORKERS GPU workers.
CLOCKQ_ADMISSION_CLOSE_ABOVE = env_float(
    "CLOCKQ_ADMISSION_CLOSE_ABOVE", _control.CLOSE_ABOVE, min_value=0.01, max_value=_control.MAX_FORECAST
)
CLOCKQ_ADMISSION_REOPEN_BELOW = env_float(
    "CLOCKQ_ADMISSION_REOPEN_BELOW", _control.REOPEN_BELOW, min_value=0.01, max_value=_control.MAX_FORECAST
)
CLOCKQ_ADMISSION_HOLDS = env_choice("CLOCKQ_ADMISSION_HOLDS", _control.HOLD_WHEN_FULL, _control.HOLD_MODES)
CLOCKQ_MAX_GPU_WORKERS = env_int("CLOCKQ_MAX_GPU_WORKERS", _control.MAX_WORKERS, min_value=1, max_value=100_000)
# Admission acts on a persistence forecast (what the predictor serves until a model beats it) only
# once this many load samples are kept; before that it stays open. A model's forecast acts at once.
CLOCKQ_ADMISSION_WARMUP_SAMPLES = env_int(
    "CLOCKQ_ADMISSION_WARMUP_SAMPLES", _control.WARMUP_SAMPLES, min_value=0, max_value=1_000_000
)
if _problems := _control.threshold_problems(
    _control.Thresholds(
        close_above=CLOCKQ_ADMISSION_CLOSE_ABOVE,
        reopen_below=CLOCKQ_ADMISSION_REOPEN_BELOW,
        max_workers=CLOCKQ_MAX_GPU_WORKERS,
        hold=CLOCKQ_ADMISSION_HOLDS,
        warmup_samples=CLOCKQ_ADMISSION_WARMUP_SAMPLES,
    )
):
    raise ImproperlyConfigured("CLOCKQ_ADMISSION_*: " + " ".join(p.message for p in _problems))

# Load history (clockq/forecasting/load_history.py): the "clockq: load sample" periodic task is created
# with this interval (afterwards the admin's Periodic tasks page changes it), and samples are
# kept this many days (the predictor trains on 30).
CLOCKQ_LOAD_SAMPLE_EVERY_S = env_int("CLOCKQ_LOAD_SAMPLE_EVERY_S", 60, min_value=15, max_value=3600)
CLOCKQ_LOAD_HISTORY_DAYS = env_int("CLOCKQ_LOAD_HISTORY_DAYS", 35, min_value=1, max_value=3650)
# The live predictor (predictor/tasks.py, on the predictor queue): "clockq: forecast" is created
# to run every CLOCKQ_FORECAST_EVERY_S (never slower than every 5 minutes: a forecast older than
# that is stale in /healthz), "clockq: train predictor" every CLOCKQ_TRAIN_EVERY_S. Training
# waits for CLOCKQ_PREDICTOR_MIN_SAMPLES load samples (and at least what its time-ordered split
# needs); until then the forecast is persistence and says so. Models are saved under
# CLOCKQ_MODEL_DIR. The LSTM's training stops after about CLOCKQ_TRAIN_BUDGET_S seconds.
CLOCKQ_FORECAST_EVERY_S = env_int("CLOCKQ_FORECAST_EVERY_S", 60, min_value=10, max_value=300)
CLOCKQ_TRAIN_EVERY_S = env_int("CLOCKQ_TRAIN_EVERY_S", 3600, min_value=300, max_value=7 * 86_400)
CLOCKQ_PREDICTOR_MIN_SAMPLES = env_int("CLOCKQ_PREDICTOR_MIN_SAMPLES", 300, min_value=50, max_value=1_000_000)
CLOCKQ_PREDICTOR_HISTORY_DAYS = env_int("CLOCKQ_PREDICTOR_HISTORY_DAYS", 30, min_value=1, max_value=3650)
CLOCKQ_TRAIN_BUDGET_S = env_float("CLOCKQ_TRAIN_BUDGET_S", 50.0, min_value=1.0, max_value=3600.0)
CLOCKQ_MODEL_DIR = Path(env_str("CLOCKQ_MODEL_DIR") or VAR_DIR / "models")

# Scale-out hook, for operators without Kubernetes: when the desired GPU worker count changes, an
# http(s):// URL gets a JSON POST, anything else is a command (split like a shell would, run
# without one) that reads the JSON on stdin. Staff configure it; it runs with clockq's rights.
CLOCKQ_SCALE_HOOK = (env_str("CLOCKQ_SCALE_HOOK") or "").strip() or None
if CLOCKQ_SCALE_HOOK is not None:
    try:
        parse_scale_hook(CLOCKQ_SCALE_HOOK)
    except ValueError as _exc:
        raise ImproperlyConfigured(f"CLOCKQ_SCALE_HOOK: {_exc}") from None
