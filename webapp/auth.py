"""HTTP basic auth on the API: off unless CLOCKQ_API_BASIC_AUTH, and then throttled."""

from __future__ import annotations

from django.conf import settings
from rest_framework.authentication import BasicAuthentication
from rest_framework.exceptions import Throttled
from rest_framework.throttling import SimpleRateThrottle


class BasicAuthThrottle(SimpleRateThrottle):
    """Basic-auth attempts per client address. Each one costs a password hash (about half a
    second of CPU), so this bounds the cost as well as the guessing; repeated failures also lock
    the username out (django-axes). The count lives in this process's cache."""

    scope = "basic-auth"

    def get_rate(self) -> str:
        return settings.CLOCKQ_API_BASIC_AUTH_RATE

    def get_cache_key(self, request, view) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class OptionalBasicAuthentication(BasicAuthentication):
    """Read at each request, so the setting can be changed (and tested) without a restart."""

    def authenticate(self, request):
        if not settings.CLOCKQ_API_BASIC_AUTH:
            return None
        if request.META.get("HTTP_AUTHORIZATION", "").lower().startswith("basic "):
            throttle = BasicAuthThrottle()
            if not throttle.allow_request(request, None):
                raise Throttled(throttle.wait())
        return super().authenticate(request)

    def authenticate_header(self, request):
        return super().authenticate_header(request) if settings.CLOCKQ_API_BASIC_AUTH else None
