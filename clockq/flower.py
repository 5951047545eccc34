"""The flower role: Celery's Flower, with repeated failed logins locked out.

Flower 2 checks HTTP basic auth on every request (BaseHandler.get_current_user) and nothing
slows guessing: 50 wrong passwords took a second, and the right one still worked after ten
wrong. clockq starts Flower through this module (`python -m clockq.flower [Flower's options]`),
which is Flower's own command with one change: its application looks at a request's basic-auth
login before any handler does, and answers 429 for AXES_COOLOFF_TIME, the right password
included, once a (username, source) failed AXES_FAILURE_LIMIT times in a row, as django-axes does
for the login page and the API, or once a username failed CLOCKQ_FLOWER_USERNAME_FAILURE_LIMIT
times from one kind of source (clockq/login_lockout.py). A source is the peer's address, or a
job's uid for a job's connection from this host (clockq/login_source.py, the web's rule too). The
counts are kept in this process: a deployment runs one Flower, and a restart forgets them (the
web's are in the database).
"""

from __future__ import annotations

import atexit
import contextlib
import hmac
import logging
import math
import signal
import sys
from base64 import b64decode

import tornado.httputil
import tornado.web
from flower import command
from flower.app import Flower

from clockq.celery import app as celery_app
from clockq.login_lockout import LockScope, LoginLockout, Refusal
from clockq.login_source import LoginSource, login_source

log = logging.getLogger("clockq.flower")


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

    def initialize(self, refusal: Refusal):
        self.refusal = refusal

    def check_xsrf_cookie(self):
        pass  # it changes nothing, and must answer 429 to a POST too

    def prepare(self):
        retry_after_s = math.ceil(self.refusal.retry_after_s)
        self.set_status(429)
        self.set_header("Retry-After", str(retry_after_s))
        self.set_header("Content-Type", "text/plain; charset=UTF-8")
        self.finish(
            f"Too many failed logins for {self.refusal.scope.value}; "
            f"try again in {math.ceil(retry_after_s / 60)} minute(s).\n"
        )


def request_source(request: tornado.httputil.HTTPServerRequest) -> LoginSource:
    """The login source of a request, from its connection's two ends. Behind a proxy that Flower
    trusts (--xheaders) the address is the one the proxy names, and its connection says nothing."""
    address = request.remote_ip or ""
    peer = getattr(getattr(request.connection, "context", None), "address", None)
    stream = getattr(request.connection, "stream", None)
    if not isinstance(peer, tuple) or peer[0] != address or stream is None or stream.socket is None:
        return login_source(address, None, None)
    return login_source(address, peer[1], stream.socket.getsockname()[:2])


class GuardedFlower(Flower):
    """Flower, whose router counts each basic-auth login it sees, right or wrong, and sends a
    locked-out one to LockedOut instead of the handler asked for: it never reaches Flower's check."""

    def __init__(self, *args, lockout: LoginLockout, **kwargs):
        super().__init__(*args, **kwargs)
        self.lockout = lockout

    def find_handler(self, request, **kwargs):
        credentials = basic_credentials(request.headers.get("Authorization", ""))
        if credentials is not None and self.options.basic_auth:
            username, source = credentials.partition(":")[0], request_source(request)
            refusal = self.lockout.refusal(username, source)
            if refusal is not None:
                return self.get_handler_delegate(request, LockedOut, {"refusal": refusal})
            # Flower's own comparison (flower/views/__init__.py), made once more here.
            if any(hmac.compare_digest(stored, credentials) for stored in self.options.basic_auth):
                self.lockout.succeeded(username, source)
            else:
                self.lockout.failed(username, source)
                refusal = self.lockout.refusal(username, source)
                if refusal is not None:
                    where = source if refusal.scope is LockScope.SOURCE else source.kind.value
                    log.warning("Flower login of %r from %s locked out after repeated failures", username, where)
        return super().find_handler(request, **kwargs)


def main(argv: list[str]) -> None:
    """What `celery -A clockq flower ARGV` does (flower/command.py), with GuardedFlower."""
    from django.conf import settings

    command.apply_env_options()
    command.apply_options(sys.argv[0], argv)
    command.extract_settings()
    command.setup_logging()
    lockout = LoginLockout(
        usernames={login.partition(":")[0] for login in command.options.basic_auth or ()},
        limit=settings.AXES_FAILURE_LIMIT,
        username_limit=settings.CLOCKQ_FLOWER_USERNAME_FAILURE_LIMIT,
        window_s=settings.AXES_COOLOFF_TIME.total_seconds(),
    )
    flower_app = GuardedFlower(capp=celery_app, options=command.options, lockout=lockout, **command.settings)
    atexit.register(flower_app.stop)
    signal.signal(signal.SIGTERM, command.sigterm_handler)
    port = flower_app.start_http_server()
    command.print_banner(celery_app, "ssl_options" in command.settings, port)
    with contextlib.suppress(KeyboardInterrupt, SystemExit):  # SIGTERM's handler exits
        flower_app.start()


if __name__ == "__main__":
    main(sys.argv[1:])
