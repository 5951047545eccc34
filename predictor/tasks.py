"""The predictor's Celery tasks, on the `predictor` queue (settings.CELERY_TASK_ROUTES), which
only the predictor worker consumes. Thin: the work is in predictor/live.py.

Every Celery process imports this module (task autodiscovery), so it must not import
TensorFlow; predictor.live loads it only when an LSTM is trained or loaded.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

from clockq.bus import heartbeat
from predictor import live

log = logging.getLogger("clockq.predictor")


@shared_task(name="clockq.forecast", ignore_result=True, acks_late=False)
def forecast() -> dict[str, Any] | None:
    # A failure is logged and this tick ends; the next tick forecasts afresh (no retry: a late
    # forecast is worth less than the next one).
    try:
        return live.forecast_and_apply()
    except Exception:
        log.exception("forecast failed; the next tick tries again")
        return None


@shared_task(name="clockq.train_predictor", ignore_result=True, acks_late=False)
def train_predictor() -> dict[str, Any]:
    try:
        return live.train()
    except Exception as exc:
        log.exception("train predictor failed; the champion stays as it was")
        return {"trained": False, "reason": f"failed: {exc}"}


@worker_ready.connect
def _start_heartbeat(sender=None, **_kwargs) -> None:
    if sender is not None and heartbeat.consumes(sender, settings.PREDICTOR_QUEUE):
        heartbeat.start(sender.hostname)
