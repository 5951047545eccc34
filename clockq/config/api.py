"""The JSON API: its body and batch limits, its ways in (tokens, the session, HTTP basic), the
/metrics token, and Django REST framework's, the schema's and the tokens' settings."""

from __future__ import annotations

import re
from datetime import timedelta

from django.core.exceptions import ImproperlyConfigured

from clockq.env import env_bool, env_int, env_or_file, env_str

# The API takes JSON only, so a cross-site form post can never reach it, and at most this many
# bytes of it (413 beyond). Forms and the admin keep Django's own limit.
CLOCKQ_API_MAX_BODY_BYTES = env_int("CLOCKQ_API_MAX_BODY_BYTES", 256 * 1024, min_value=1024, max_value=64 * 2**20)
DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * 2**20
# A batch submit (`POST /api/jobs` with a JSON list) takes at most this many jobs, all or none.
# The body limit above still applies: 256 KiB holds 500 plain jobs (about 120 bytes each), not
# 500 with large params.
CLOCKQ_API_MAX_BATCH = env_int("CLOCKQ_API_MAX_BATCH", 500, min_value=1, max_value=10_000)
# HTTP basic auth on the API hashes a password on every request; it is off unless asked for, and
# then throttled per address. Tokens (`manage.py createtoken`, or the API tokens page) and the
# browser session are the documented ways in.
CLOCKQ_API_BASIC_AUTH = env_bool("CLOCKQ_API_BASIC_AUTH", False)
CLOCKQ_API_BASIC_AUTH_RATE = env_str("CLOCKQ_API_BASIC_AUTH_RATE") or "30/min"
if not re.fullmatch(r"[1-9][0-9]*/(s|sec|m|min|h|hour|d|day)", CLOCKQ_API_BASIC_AUTH_RATE):
    raise ImproperlyConfigured(
        f"CLOCKQ_API_BASIC_AUTH_RATE={CLOCKQ_API_BASIC_AUTH_RATE!r}: use requests per period, e.g. 30/min"
    )
# /metrics answers `Authorization: Bearer <this token>` (Prometheus) and staff sessions; unset,
# staff sessions only. Long enough that guessing it is hopeless.
CLOCKQ_METRICS_TOKEN = env_or_file("CLOCKQ_METRICS_TOKEN") or None
if CLOCKQ_METRICS_TOKEN is not None and not re.fullmatch(r"[\x21-\x7e]{24,}", CLOCKQ_METRICS_TOKEN):
    raise ImproperlyConfigured(
        "CLOCKQ_METRICS_TOKEN must be at least 24 printable ASCII characters without spaces, "
        "e.g. from `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
    )
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first, so an unauthenticated call gets 401 with `WWW-Authenticate: Token`.
        "webapp.auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
        "webapp.auth.OptionalBasicAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["webapp.parsers.BoundedJSONParser"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "webapp.api_errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "clockq API",
    "DESCRIPTION": "Submit, follow and cancel GPU jobs. Authenticate with `Authorization: Token <token>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
}
REST_KNOX = {
    "TOKEN_TTL": timedelta(days=env_int("CLOCKQ_API_TOKEN_TTL_DAYS", 90, min_value=1, max_value=3650)),
    "AUTO_REFRESH": False,
}
