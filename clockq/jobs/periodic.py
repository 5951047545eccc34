"""Beat's one schedule: every periodic task clockq runs, in django-celery-beat's tables, where
operators see and edit them in the admin (Periodic tasks). Beat's DatabaseScheduler notices an
edit within a few seconds; no restart is needed.

Each task is written into the tables in one of two ways:

- most are created once, by a migration (`ensure_periodic_tasks`), and are the admin's to edit
  from then on; a period that is a setting (CLOCKQ_LOAD_SAMPLE_EVERY_S, ...) is the one it is
  created with;
- the control role's maintenance (`written_by_beat`: the reconciler, the lease reaper, retention)
  is written by beat at each start (`beat_schedule`, read by control/beat.py), with the period its
  setting gives then (CLOCKQ_RECONCILE_EVERY_S, CLOCKQ_REAP_EVERY_S, CLOCKQ_RETENTION_EVERY_S): an
  operator tunes those by environment, as every host's other settings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db.models import Max

from clockq.jobs import queue_samples
from clockq.policy.promotion import BATCH_CHANCE_EVERY_S, PROMOTION_TICK_S
from clockq.policy.tiers import BP

QUEUE_SAMPLE = "clockq: queue sample"


@dataclass(frozen=True)
class Periodic:
    name: str
    task: str
    every_s: int
    kwargs: dict = field(default_factory=dict)
    description: str = ""
    queue: str = ""  # empty: settings.CONTROL_QUEUE
    written_by_beat: bool = False  # True: beat writes it at each start (beat_schedule), not a migration


PERIODIC_TASKS: tuple[Periodic, ...] = (
    Periodic(
        "clockq: promotion tick",
        "clockq.promotion_tick",
        PROMOTION_TICK_S,
        description="Counts rounds and skips; promotes starved jobs (tiers: promote after rounds, promote to).",
    ),
    Periodic(
        "clockq: batch chance BP",
        "clockq.batch_chance",
        BATCH_CHANCE_EVERY_S,
        {"tier": BP.code},
        description="The oldest waiting BP jobs are lifted to a more urgent tier (tiers: chance jobs, chance to).",
    ),
    Periodic(
        "clockq: SLO check",
        "clockq.slo_check",
        10,
        description="Times out jobs past their deadline or their tier's start timeout; marks late ones.",
    ),
    Periodic("clockq: KPI rollup", "clockq.kpi_rollup", 60, description="Fills the KPI tables behind /api/kpis."),
    Periodic(
        QUEUE_SAMPLE,
        "clockq.queue_sample",
        queue_samples.STEP_S,
        description="Keeps the queue depth, longest waits and load index of each 5 s in Redis for an hour "
        "(the dashboard's 15 min and 1 h windows), so a burst between two minute samples shows.",
    ),
)

LOAD_SAMPLE = "clockq: load sample"
FORECAST = "clockq: forecast"
TRAIN_PREDICTOR = "clockq: train predictor"
RECONCILE = "clockq: reconcile queued jobs"
REAP = "clockq: reap expired leases"
DELETE_OLD_CHECKPOINTS = "clockq: delete old checkpoints"


def periodic_tasks() -> tuple[Periodic, ...]:
    """Every periodic task: PERIODIC_TASKS and those whose period is a setting, read now."""
    return (
        *PERIODIC_TASKS,
        Periodic(
            DELETE_OLD_CHECKPOINTS,
            "clockq.delete_old_checkpoints",
            settings.RETENTION_EVERY_S,
            written_by_beat=True,
        ),
        Periodic(
            RECONCILE,
            "clockq.reconcile_queued_jobs",
            settings.RECONCILE_EVERY_S,
            written_by_beat=True,
        ),
        Periodic(
            REAP,
            "clockq.reap_expired_leases",
            settings.REAP_EVERY_S,
            written_by_beat=True,
        ),
        Periodic(
            LOAD_SAMPLE,
            "clockq.load_sample",
            settings.CLOCKQ_LOAD_SAMPLE_EVERY_S,
            description="Records the cluster's load (MetricSample), the history the load forecast learns from; "
            "deletes samples older than CLOCKQ_LOAD_HISTORY_DAYS. Created every CLOCKQ_LOAD_SAMPLE_EVERY_S; "
            "change the interval here.",
        ),
        Periodic(
            FORECAST,
            "clockq.forecast",
            settings.CLOCKQ_FORECAST_EVERY_S,
            description="Forecasts the load index 15 minutes ahead with the champion model (persistence until "
            "one is trained) and applies it to the control state. Runs on the predictor worker. Created every "
            "CLOCKQ_FORECAST_EVERY_S; keep it at 300 s or less: an older forecast is stale in /healthz.",
            queue=settings.PREDICTOR_QUEUE,
        ),
        Periodic(
            TRAIN_PREDICTOR,
            "clockq.train_predictor",
            settings.CLOCKQ_TRAIN_EVERY_S,
            description="Retrains the load forecast (linear and LSTM) on the stored load history and chooses the "
            "champion against persistence. Runs on the predictor worker. Created every CLOCKQ_TRAIN_EVERY_S.",
            queue=settings.PREDICTOR_QUEUE,
        ),
    )


def ensure_periodic_tasks(periodic_task_model, interval_model) -> None:
    """Create the missing ones that beat does not write; an operator's edits to existing ones are kept."""
    for spec in periodic_tasks():
        if spec.written_by_beat or periodic_task_model.objects.filter(name=spec.name).exists():
            continue
        interval, _ = interval_model.objects.get_or_create(every=spec.every_s, period="seconds")
        periodic_task_model.objects.create(
            name=spec.name,
            task=spec.task,
            interval=interval,
            kwargs=json.dumps(spec.kwargs),
            queue=spec.queue or settings.CONTROL_QUEUE,
            # A tick that waited longer than its period is dropped; the next one does its work.
            expire_seconds=spec.every_s,
            description=spec.description,
        )


def beat_schedule() -> dict[str, dict]:
    """The tasks beat writes at each start, as Celery's beat_schedule has them (the
    DatabaseScheduler's `update_from_dict` writes each row, keeping whether it is enabled). They
    carry no expiry: django-celery-beat reads one only as `expire_seconds`, so none was ever
    written for them, and a reconcile or a reap that waited still has its work to do."""
    return {
        spec.name: {
            "task": spec.task,
            "schedule": float(spec.every_s),
            "kwargs": spec.kwargs,
            "options": {"queue": spec.queue or settings.CONTROL_QUEUE},
        }
        for spec in periodic_tasks()
        if spec.written_by_beat
    }


def beat_last_run() -> datetime | None:
    """When celery beat last sent an enabled periodic task, as its DatabaseScheduler writes it
    back (after every send: settings.CELERY_BEAT_SYNC_EVERY): a live beat has written within the
    shortest task interval. None before any beat ran."""
    from django_celery_beat.models import PeriodicTask

    return PeriodicTask.objects.filter(enabled=True).aggregate(at=Max("last_run_at"))["at"]
