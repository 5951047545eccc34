"""Refuse an oversized API body before anything reads it."""

from __future__ import annotations

from django.conf import settings
from django.http import JsonResponse


class ApiBodyLimitMiddleware:
    """A request to /api/ declaring more than CLOCKQ_API_MAX_BODY_BYTES gets a 413 at once, so a
    huge body is never read into memory or parsed. (Django's DATA_UPLOAD_MAX_MEMORY_SIZE does not
    cover the stream the API's parser reads.) A body without a length is read as empty."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith("/api/"):
            limit = settings.CLOCKQ_API_MAX_BODY_BYTES
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                return JsonResponse({"detail": "Content-Length is not a number."}, status=400)
            if length > limit:
                return JsonResponse(
                    {"detail": f"The request body is {length} bytes; the API accepts at most {limit}."}, status=413
                )
        return self.get_response(request)
