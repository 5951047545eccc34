"""The API's authentication: tokens (django-rest-knox), and HTTP basic auth, off unless
CLOCKQ_API_BASIC_AUTH, and then throttled."""

from __future__ import annotations

from django.conf import settings
from django.utils import timezone
from knox.auth import TokenAuthentication
from rest_framework.authentication import BasicAuthentication
from rest_framework.exceptions import Throttled
from rest_framework.throttling import SimpleRateThrottle

from clockq.login_source import axes_client_ip


class BasicAuthThrottle(SimpleRateThrottle):
    """Basic-auth attempts per source. Each one costs a password hash (about half a second of
    CPU), so this bounds the cost as well as the guessing; repeated failures also lock the
    username out (django-axes). The source is django-axes' (clockq/login_source.py): a job's
    program on this host is its own source, so that its attempts never use up the admin's on the
    same address. The count lives in this process's cache."""

    scope = "basic-auth"

    def get_rate(self) -> str:
        return settings.CLOCKQ_API_BASIC_AUTH_RATE

    def get_cache_key(self, request, view) -> str:
        return self.cache_format % {"scope": self.scope, "ident": axes_client_ip(request)}


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


class ApiTokenAuthentication(TokenAuthentication):
    """knox's token authentication, less its sweep of the user's other expired tokens on every
    request: one more query per API call, on the submit's hot path. The presented token is still
    refused, and deleted, once expired; the others are swept where tokens are listed and made
    (webapp/tokens.py)."""

    def _cleanup_token(self, auth_token) -> bool:
        if auth_token.expiry is not None and auth_token.expiry < timezone.now():
            auth_token.delete()
            return True
        return False
