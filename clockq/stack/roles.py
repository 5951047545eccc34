"""The command line of every role, in one place so every launcher agrees.

A role is named by the processes it runs, never by importing its code: the launcher composes
the clients (webapp, workers, control, predictor) without reaching into them.
"""

from __future__ import annotations

import sys

from django.conf import settings

from clockq.policy.tiers import QUEUES_IN_ORDER, REALTIME_QUEUES


def celery_worker_argv(name: str, host: str | None, queues: str, pool: str, loglevel: str) -> list[str]:
    return [
        *(sys.executable, "-m", "celery", "-A", "clockq", "worker"),
        *("--hostname", f"{name}@{host or settings.CLOCKQ_HOST}"),
        *("--queues", queues, "--concurrency", "1", "--pool", pool, "--loglevel", loglevel),
        # Mingle and gossip sync state between workers at start; clockq keeps state in the
        # database, and skipping them saves seconds on every (re)start.
        *("--without-mingle", "--without-gossip"),
    ]


def gpu_worker_argv(gpu_index: int, host: str | None = None, loglevel: str = "INFO") -> list[str]:
    """One GPU worker: concurrency 1, consuming the five tier queues in strict order. Prefork,
    so the parent keeps heartbeating while a long slice runs; task events for Flower."""
    queues = ",".join(QUEUES_IN_ORDER)
    return [*celery_worker_argv(f"gpu{gpu_index}", host, queues, "prefork", loglevel), "--task-events"]


def rt_lane_argv(gpu_index: int, host: str | None = None, loglevel: str = "INFO") -> list[str]:
    """A GPU's standby RT lane (workers/rt_lane.py): a second worker on the same GPU that takes
    only RT jobs, started beside the GPU's main worker and kept warm; task events for Flower."""
    queues = ",".join(REALTIME_QUEUES)
    return [*celery_worker_argv(f"rt{gpu_index}", host, queues, "prefork", loglevel), "--task-events"]


def gpu_host_argv() -> list[str]:
    """The gpu role: one pinned worker per GPU of this host, supervised (`manage.py gpuworkers`)."""
    return [sys.executable, "manage.py", "gpuworkers"]


def control_worker_argv(host: str | None = None, loglevel: str = "INFO") -> list[str]:
    """The control role: the worker for beat's maintenance tasks (reconciler, lease reaper, ...)."""
    return celery_worker_argv("control", host, settings.CONTROL_QUEUE, "solo", loglevel)


def predictor_worker_argv(host: str | None = None, loglevel: str = "INFO") -> list[str]:
    """The load predictor's worker: the `predictor` queue only (forecast, training), one task
    at a time in its own process (solo), which keeps the loaded champion between forecasts. It
    is the one Celery process that loads TensorFlow."""
    return celery_worker_argv("predictor", host, settings.PREDICTOR_QUEUE, "solo", loglevel)


def web_argv(bind: str, port: int) -> list[str]:
    return [
        *(sys.executable, "-m", "gunicorn", "clockq.wsgi:application"),
        *("--bind", f"{bind}:{port}", "--workers", "2", "--threads", "4", "--access-logfile", "-"),
    ]


def beat_argv(loglevel: str = "INFO") -> list[str]:
    """Celery beat, reading its schedule from the database (django-celery-beat), where operators
    edit it in the admin."""
    return [
        *(sys.executable, "-m", "celery", "-A", "clockq", "beat", "--loglevel", loglevel),
        *("--scheduler", "control.beat:LockedDatabaseScheduler"),
    ]


def flower_argv(bind: str, port: int) -> list[str]:
    """Flower's own command, with failed logins locked out (clockq/flower.py)."""
    return [sys.executable, "-m", "clockq.flower", f"--address={bind}", f"--port={port}"]
