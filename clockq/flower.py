"""The flower role: Celery's Flower, with repeated failed logins locked out.

Flower 2 checks HTTP basic auth on every request (BaseHandler.get_current_user) and nothing
slows guessing: 50 wrong passwords took a second, and the right one still worked after ten
wrong. clockq starts Flower through this module (`python -m clockq.flower [Flower's options]`),
which is Flower's own command with one change: its application looks at a request's basic-auth
login before any handler does, and a (username, address) that failed AXES_FAILURE_LIMIT times
in a row is answered 429 for AXES_COOLOFF_TIME, the right password included, as django-axes
does for the login page and the API. The count is kept in this process: a deployment runs one
Flower, and a restart forgets it (the web's count is in the database).
"""

from __future__ import annotations

import atexit
import contextlib
import hmac
import logging
import math
import signal
import sys
import time
from base64 import b64decode
from collections.abc import Callable
from dataclasses import dataclass

import tornado.web
from flower import command
from flower.app import Flower

from clockq.celery import app as celery_app

log = logging.getLogger("clockq.flower")


@dataclass
class _Failures:
    count: int
    last_at: float


class LoginLockout:
    """Failed logins per key (username, address). After `limit` in a row, the key is locked for
    `window_s` from the last of them, whatever is presented; then it starts again from none. A
    success resets the count. Failures older than `window_s` are forgotten."""

    MAX_KEYS = 10_000  # a guesser cycling usernames cannot grow this without bound

    def __init__(self, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic):
        self.limit = limit
        self.window_s = window_s
        self.clock = clock
        self._failures: dict[tuple[str, str], _Failures] = {}

    def locked_for_s(self, key: tuple[str, str]) -> float:
        """Seconds until `key` may log in again; 0 when it may now."""
        failures = self._failures.get(key)
        if failures is None or failures.count < self.limit:
            return 0.0
        left = failures.last_at + self.window_s - self.clock()
        if left <= 0:
            del self._failures[key]
            return 0.0
        return left

    def failed(self, key: tuple[str, str]) -> None:
        now = self.clock()
        failures = self._failures.get(key)
        if failures is None or now - failures.last_at >= self.window_s:
            if len(self._failures) >= self.MAX_KEYS:
                self._forget_unlocked(now)
            failures = self._failures[key] = _Failures(0, now)
        failures.count += 1
        failures.last_at = now

    def succeeded(self, key: tuple[str, str]) -> None:
        self._failures.pop(key, None)

    def _forget_unlocked(self, now: float) -> None:
        self._failures = {
            key: f for key, f in self._failures.items() if f.count >= self.limit and now - f.last_at < self.window_s
        }


def basic_credentials(header: str) -> str | None:
    """The `user:password` of a basic-auth header, read as Flower reads it, or None where Flower
    refuses the header as malformed (a login that cannot succeed is not counted)."""
    try:
        scheme, encoded = header.split()
        credentials = b64decode(encoded.encode()).decode()
    except ValueError:
        return None
    return credentials if scheme == "Basic" else None


class LockedOut(tornado.web.RequestHandler):
    """The answer to a locked-out login, whatever was asked."""

    def initialize(self, retry_after_s: float):
        self.retry_after_s = math.ceil(retry_after_s)

    def check_xsrf_cookie(self):
        pass  # it changes nothing, and must answer 429 to a POST too

    def prepare(self):
        self.set_status(429)
        self.set_header("Retry-After", str(self.retry_after_s))
        self.set_header("Content-Type", "text/plain; charset=UTF-8")
        self.finish(
            "Too many failed logins for this user from this address; "
            f"try again in {math.ceil(self.retry_after_s / 60)} minute(s).\n"
        )


class GuardedFlower(Flower):
    """Flower, whose router counts each basic-auth login it sees, right or wrong, and sends a
    locked-out one to LockedOut instead of the handler asked for: it never reaches Flower's check."""

    def __init__(self, *args, lockout: LoginLockout, **kwargs):
        super().__init__(*args, **kwargs)
        self.lockout = lockout

    def find_handler(self, request, **kwargs):
        credentials = basic_credentials(request.headers.get("Authorization", ""))
        if credentials is not None and self.options.basic_auth:
            key = (credentials.partition(":")[0], request.remote_ip or "")
            locked_for_s = self.lockout.locked_for_s(key)
            if locked_for_s:
                return self.get_handler_delegate(request, LockedOut, {"retry_after_s": locked_for_s})
            # Flower's own comparison (flower/views/__init__.py), made once more here.
            if any(hmac.compare_digest(stored, credentials) for stored in self.options.basic_auth):
                self.lockout.succeeded(key)
            else:
                self.lockout.failed(key)
                if self.lockout.locked_for_s(key):
                    log.warning("Flower login of %r from %s locked out after repeated failures", *key)
        return super().find_handler(request, **kwargs)


def main(argv: list[str]) -> None:
    """What `celery -A clockq flower ARGV` does (flower/command.py), with GuardedFlower."""
    from django.conf import settings

    command.apply_env_options()
    command.apply_options(sys.argv[0], argv)
    command.extract_settings()
    command.setup_logging()
    lockout = LoginLockout(settings.AXES_FAILURE_LIMIT, settings.AXES_COOLOFF_TIME.total_seconds())
    flower_app = GuardedFlower(capp=celery_app, options=command.options, lockout=lockout, **command.settings)
    atexit.register(flower_app.stop)
    signal.signal(signal.SIGTERM, command.sigterm_handler)
    port = flower_app.start_http_server()
    command.print_banner(celery_app, "ssl_options" in command.settings, port)
    with contextlib.suppress(KeyboardInterrupt, SystemExit):  # SIGTERM's handler exits
        flower_app.start()


if __name__ == "__main__":
    main(sys.argv[1:])
