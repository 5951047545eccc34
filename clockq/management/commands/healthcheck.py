"""python manage.py healthcheck --role ROLE: whether this host's ROLE is alive, for a container's
health check (compose/compose.yaml) and a Kubernetes probe (compose/kubernetes/). Exits 0 with
one line saying what it saw, or 1 with the reason.

It asks what each role shows the rest of the cluster, never the processes themselves:

- `web`: gunicorn answers `/healthz` on PORT. A 503 counts as alive: it means the cluster has no
  GPU worker that takes jobs, which restarting the web server would not mend;
- `flower`: Flower answers `/healthcheck` on FLOWER_PORT;
- `gpu`, `control`, `predictor`: the role's workers of this host (CLOCKQ_HOST) have live
  heartbeats in Redis (clockq/bus/heartbeat.py): `control@<host>`, `predictor@<host>`, at least
  one `gpu<N>@<host>`. A worker busy with a long slice or a training still beats;
- `beat`: the broker answers, where beat's lock lives. A beat that waits for the lock is as
  healthy as the one that leads; one that dies ends runstack, and with it the container.
"""

from __future__ import annotations

import ipaddress
import os
import re
import urllib.error
import urllib.request

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from clockq.bus import heartbeat
from clockq.bus.client import client
from clockq.stack import preflight

HTTP_TIMEOUT_S = 5.0
# /healthz answers 503 while no GPU worker takes jobs: the web server itself is fine.
WEB_ALIVE = (200, 503)


class Unhealthy(Exception):
    pass


def local_address(bind: str) -> str:
    """Where this host reaches a server bound to `bind`, as a URL's host part."""
    if bind in ("", "0.0.0.0"):
        return "127.0.0.1"
    if bind == "::":
        return "[::1]"
    try:
        return f"[{bind}]" if ipaddress.ip_address(bind).version == 6 else bind
    except ValueError:
        return bind  # a host name


def http_status(url: str) -> int:
    """The HTTP status `url` answers with; Unhealthy when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError) as exc:
        raise Unhealthy(f"{url} does not answer: {getattr(exc, 'reason', exc)}") from None


def check_http(url: str, alive: tuple[int, ...]) -> str:
    status = http_status(url)
    if status not in alive:
        raise Unhealthy(f"{url} answered {status}")
    return f"{url} answered {status}"


def live_worker_names(host: str) -> set[str]:
    """The workers of `host` whose heartbeat is live."""
    try:
        workers = heartbeat.live_workers()
    except redis.RedisError as exc:
        raise Unhealthy(f"the broker does not answer: {exc}") from None
    suffix = f"@{host}"
    return {w["hostname"] for w in workers if str(w.get("hostname", "")).endswith(suffix)}


def check_workers(role: str, host: str) -> str:
    names = live_worker_names(host)
    if role == "gpu":
        gpus = sorted(n for n in names if re.fullmatch(rf"gpu\d+@{re.escape(host)}", n))
        if not gpus:
            raise Unhealthy(f"no GPU worker of host {host} has a live heartbeat")
        return f"live: {', '.join(gpus)}"
    name = f"{role}@{host}"
    if name not in names:
        raise Unhealthy(f"{name} has no live heartbeat")
    return f"live: {name}"


def check_broker() -> str:
    try:
        client().ping()
    except redis.RedisError as exc:
        raise Unhealthy(f"the broker does not answer: {exc}") from None
    return "the broker answers"


def check_role(role: str, *, bind: str, host: str) -> str:
    """One line on what shows `role` alive on this host; Unhealthy saying what does not."""
    address = local_address(bind)
    if role == "web":
        return check_http(f"http://{address}:{settings.PORT}/healthz", WEB_ALIVE)
    if role == "flower":
        return check_http(f"http://{address}:{settings.FLOWER_PORT}/healthcheck", (200,))
    if role == "beat":
        return check_broker()
    return check_workers(role, host)


class Command(BaseCommand):
    help = "Exit 0 when this host's role is alive (a container health check or a Kubernetes probe), 1 when not."

    def add_arguments(self, parser):
        parser.add_argument(
            "--role",
            default=os.environ.get("CLOCKQ_ROLE", preflight.ALL),
            help=f"{preflight.ALL}, or a comma list of {', '.join(preflight.ROLES)}",
        )
        parser.add_argument(
            "--bind",
            default=os.environ.get("CLOCKQ_BIND", "127.0.0.1"),
            help="the address the web role and Flower listen on (CLOCKQ_BIND)",
        )

    def handle(self, *args, role: str, bind: str, **options):
        try:
            roles = preflight.parse_roles(role)
        except ValueError as exc:
            raise CommandError(f"--role {role!r}: {exc}") from None
        for name in preflight.ROLES:
            if name not in roles:
                continue
            try:
                seen = check_role(name, bind=bind, host=settings.CLOCKQ_HOST)
            except Unhealthy as exc:
                raise CommandError(f"{name} is not healthy: {exc}", returncode=1) from None
            self.stdout.write(f"{name}: {seen}")
