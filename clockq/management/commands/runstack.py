"""python manage.py runstack: the whole system on one machine (what `make run` starts).

Migrates, ensures the admin user, starts a private Redis unless REDIS_URL is set, then every role
(clockq/stack/roles.py): the web server, the GPU workers, a control worker, the predictor
worker, celery beat and Flower. Ctrl-C or SIGTERM stops everything it started.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from clockq.bus.redis_server import redis_server_argv
from clockq.env import persistent_secret
from clockq.management.commands.ensureadmin import ADMIN_USERNAME, admin_password
from clockq.stack import roles
from clockq.stack.supervisor import Child, Supervisor


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def protect_var_dir(var_dir: Path) -> None:
    """Everything clockq writes under var/ (the database, secrets, the broker's files) is 0600,
    and var/ itself can be crossed but not listed by other users (a sandbox, set up as its
    program's uid, needs to reach its job's work folder in it). New files get 0600 from the umask, which every
    child process inherits; files made before this get it here."""
    os.umask(0o077)
    var_dir.mkdir(parents=True, exist_ok=True)
    var_dir.chmod(0o711)
    for path in var_dir.iterdir():
        if path.is_file():
            path.chmod(0o600)
    redis_dir = var_dir / "redis"
    if redis_dir.is_dir():
        redis_dir.chmod(0o700)


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class Command(BaseCommand):
    help = "Start clockq on this machine: broker (if needed), web, GPU, control and predictor workers, beat, Flower."

    def add_arguments(self, parser):
        parser.add_argument("--demo", action="store_true", help="submit a mixed sample workload once healthy")
        parser.add_argument(
            "--bind",
            default=os.environ.get("CLOCKQ_BIND", "127.0.0.1"),
            help="address to listen on, without a port (the web port is PORT, Flower's FLOWER_PORT)",
        )

    def handle(self, *args, demo: bool, bind: str, **options):
        if not _is_address(bind):
            raise CommandError(
                f"--bind {bind!r}: give an address without a port, such as 127.0.0.1 or 0.0.0.0; "
                "the ports are PORT (web) and FLOWER_PORT"
            )
        protect_var_dir(settings.VAR_DIR)
        call_command("migrate", interactive=False, verbosity=0)
        call_command("ensureadmin")
        password, source = admin_password()
        children: list[Child] = []
        env: dict[str, str] = {}

        if not os.environ.get("REDIS_URL"):
            children.append(_embedded_redis())
        env["REDIS_URL"] = settings.REDIS_URL
        for name, port in (("PORT", settings.PORT), ("FLOWER_PORT", settings.FLOWER_PORT)):
            if not port_is_free(port):
                raise CommandError(f"{name}={port} is taken; choose another port with {name}=...")

        children += [
            Child("web", roles.web_argv(bind, settings.PORT), restart=False),
            Child("gpuworkers", roles.gpu_host_argv(), restart=False),
            Child("control", roles.control_worker_argv()),
            # Forecasts every minute and retrains hourly (beat sends both to its queue).
            Child("predictor", roles.predictor_worker_argv()),
            Child("beat", roles.beat_argv(), restart=False),
            Child(
                "flower",
                roles.flower_argv(bind, settings.FLOWER_PORT),
                # Through the environment, so the password never shows in `ps`.
                env={"FLOWER_BASIC_AUTH": f"{ADMIN_USERNAME}:{password}"},
                restart=False,
            ),
        ]
        for child in children:
            child.env = {**env, **child.env}

        host = "localhost" if bind in ("127.0.0.1", "0.0.0.0") else bind
        web = f"http://{host}:{settings.PORT}"
        banner = (
            f"\nclockq is starting\n"
            f"  web      {web}/jobs/   (submit: {web}/jobs/new)\n"
            f"  admin    {web}/admin/\n"
            f"  dashboard {web}/dashboard   (staff; Prometheus: {web}/metrics)\n"
            f"  API      {web}/api/jobs\n"
            f"  health   {web}/healthz\n"
            f"  Flower   http://{host}:{settings.FLOWER_PORT}/\n"
            f"  broker   {_without_password(settings.REDIS_URL)}\n"
            f"  login    {ADMIN_USERNAME}, password in {source}   (also Flower's basic auth)\n"
            f"Ctrl-C stops everything.\n"
        )
        self.stdout.write(banner)
        threading.Thread(target=self._announce_ready, args=(web, demo), daemon=True).start()
        raise SystemExit(Supervisor(children, stop_grace_s=60).run_forever())

    def _announce_ready(self, web: str, demo: bool) -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{web}/healthz", timeout=2) as response:
                    if response.status == 200:
                        self.stdout.write(f"clockq is ready: {web}/healthz answers 200")
                        if demo:
                            call_command("submitdemo")
                        return
            except OSError:
                pass
            time.sleep(1)
        self.stderr.write("clockq did not become healthy within 180 s; see the logs above")


def _embedded_redis() -> Child:
    """A private Redis for this machine alone, restarted if it dies: it reloads its append-only
    file, and every client reconnects."""
    port = settings.EMBEDDED_REDIS_PORT
    if not port_is_free(port):
        raise CommandError(f"port {port} for the embedded Redis is taken; set CLOCKQ_EMBEDDED_REDIS_PORT or REDIS_URL")
    data = settings.VAR_DIR / "redis"
    data.mkdir(parents=True, exist_ok=True)
    broker_password = persistent_secret(settings.EMBEDDED_REDIS_PASSWORD_FILE, nbytes=24)
    return Child("redis", redis_server_argv(port, data, durable=True, password=broker_password), stop_last=True)


def _is_address(bind: str) -> bool:
    """An IP address or a host name, without a port: `--bind 0.0.0.0:8000` would end in a web
    address with two ports and a Flower that cannot resolve its host."""
    try:
        ipaddress.ip_address(bind)
        return True
    except ValueError:
        return bool(bind) and ":" not in bind and not any(c.isspace() or c == "/" for c in bind)
