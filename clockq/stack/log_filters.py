"""Logging filters for the settings' LOGGING.

Django's request logger reports every 5xx answer as an ERROR. /healthz answers 503 by design
while the system cannot run jobs: at every start until the first GPU worker is up (the launcher
polls it each second), and whenever monitoring asks while a broker or the workers are away. That
answer is the health check working, and monitoring reads it from /healthz itself; as an ERROR
line it made every normal start look broken. So a 503 of /healthz is logged at INFO. Every other
record, a 500 of /healthz included, keeps its level.
"""

from __future__ import annotations

import logging

HEALTH_PATH = "/healthz"


class HealthAnswerFilter(logging.Filter):
    """Logs /healthz's 503 answers at INFO rather than ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        if getattr(record, "status_code", None) == 503 and getattr(request, "path", None) == HEALTH_PATH:
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True
