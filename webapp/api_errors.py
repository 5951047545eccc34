"""The API answers every error in JSON, a 500 included, and logs the 500's traceback."""

from __future__ import annotations

import logging

from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from clockq.jobs.quotas import QuotaExceeded

log = logging.getLogger("clockq.api")


def exception_handler(exc, context):
    response = drf_exception_handler(exc, context)
    if response is not None:
        return response  # a 4xx that DRF already explains
    if isinstance(exc, QuotaExceeded):  # two submits raced past the form's check
        return Response({"detail": str(exc)}, status=400)
    request = context.get("request")
    log.error(
        "500 on %s %s",
        getattr(request, "method", "?"),
        getattr(request, "path", "?"),
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    return Response({"detail": "Internal error; it has been logged."}, status=500)
