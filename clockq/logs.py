"""What clockq's processes log, and at what level: the settings' LOGGING (`logging_config`).

- clockq's own loggers at CLOCKQ_LOG_LEVEL. A GPU worker logs one INFO line per job when it ends
  (workers/run/summary.py); each run of a job is DEBUG.
- Celery's own line for every task received and every task done is a line per slice on a GPU
  worker (thousands an hour): DEBUG, shown only with CLOCKQ_LOG_LEVEL=DEBUG. Failures and
  retries still log.
- Every 500 leaves its traceback in the log, whatever DEBUG says. Django's request logger reports
  every 5xx as an ERROR, but /healthz answers 503 by design while the system cannot run jobs: at
  every start until the first GPU worker is up (the launcher polls it each second), and whenever
  monitoring asks while a broker or the workers are away. That answer is the health check
  working, and monitoring reads it from /healthz itself; as an ERROR line it made every normal
  start look broken. So a 503 of /healthz is logged at INFO (`HealthAnswerFilter`); every other
  record, a 500 of /healthz included, keeps its level.
"""

from __future__ import annotations

import logging
from typing import Any

HEALTH_PATH = "/healthz"


class HealthAnswerFilter(logging.Filter):
    """Logs /healthz's 503 answers at INFO rather than ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        if getattr(record, "status_code", None) == 503 and getattr(request, "path", None) == HEALTH_PATH:
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


def logging_config(level: str) -> dict[str, Any]:
    """The settings' LOGGING for clockq's log level (DEBUG, INFO, ...)."""
    per_task = "DEBUG" if level == "DEBUG" else "WARNING"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
        "filters": {"health_answers": {"()": f"{__name__}.HealthAnswerFilter"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
        "loggers": {
            "clockq": {"handlers": ["console"], "level": level, "propagate": False},
            "django.request": {
                "handlers": ["console"],
                "level": "ERROR",
                "propagate": False,
                "filters": ["health_answers"],
            },
            "celery.app.trace": {"level": per_task},
            "celery.worker.strategy": {"level": per_task},
        },
    }
