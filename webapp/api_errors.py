"""The API answers every error in JSON, a 500 included, and logs the 500's traceback."""

from __future__ import annotations

import logging

from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

log = logging.getLogger("clockq.api")


def exception_handler(exc, context):
    response = drf_exception_handler(exc, context)
    if response is not None:
        return response  # a 4xx that DRF already explains
    request = context.get("request")
    log.error(
        "500 on %s %s",
        getattr(request, "method", "?"),
        getattr(request, "path", "?"),
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    return Response({"detail": "Internal error; it has been logged."}, status=500)
