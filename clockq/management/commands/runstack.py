"""python manage.py runstack: clockq's roles on this machine.

`--role all` (the default, what `make run` starts) is the whole system on one machine: it
migrates, ensures the admin user, starts a private Redis unless REDIS_URL is set, then every
role (clockq/stack/roles.py). `--role web,beat,...` starts only those roles, as one host of a
cluster that shares one PostgreSQL, one Redis and one checkpoint folder; a setup that would run
alone by mistake is refused first (clockq/stack/preflight.py). Ctrl-C or SIGTERM stops
everything it started; so does its death by any other means (clockq/supervision/supervisor.py), and
what an earlier start of this checkout left running is stopped before this one checks its ports
(clockq/stack/leftovers.py).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, close_old_connections, connection
from django.db.migrations.executor import MigrationExecutor

from clockq import embedded_redis
from clockq.bus import names
from clockq.bus.client import client
from clockq.bus.redis_server import redis_server_argv
from clockq.env import persistent_secret
from clockq.fleet import marker, registry
from clockq.management.commands.ensureadmin import ADMIN_USERNAME, admin_password
from clockq.stack import ports, preflight, roles
from clockq.supervision import records
from clockq.supervision.supervisor import Child, Supervisor

log = logging.getLogger("clockq.runstack")

WAIT_POLL_S = 2.0
# Held while one web host migrates, so two web hosts starting at once do not both migrate.
MIGRATE_LOCK_ID = 0x636C6F636B71  # "clockq"


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
    help = "Start clockq's roles on this machine: all of them (the default), or some, as one host of a cluster."

    def add_arguments(self, parser):
        parser.add_argument(
            "--role",
            default=os.environ.get("CLOCKQ_ROLE", preflight.ALL),
            help=f"{preflight.ALL} (everything on this machine), or a comma list of {', '.join(preflight.ROLES)}",
        )
        parser.add_argument("--demo", action="store_true", help="submit a mixed sample workload once healthy")
        parser.add_argument(
            "--bind",
            default=os.environ.get("CLOCKQ_BIND", "127.0.0.1"),
            help="address to listen on, without a port (the web port is PORT, Flower's FLOWER_PORT)",
        )

    def handle(self, *args, demo: bool = False, bind: str = "127.0.0.1", role: str = preflight.ALL, **options):
        try:
            wanted = preflight.parse_roles(role)
        except ValueError as exc:
            raise CommandError(f"--role {role!r}: {exc}") from None
        if not _is_address(bind):
            raise CommandError(
                f"--bind {bind!r}: give an address without a port, such as 127.0.0.1 or 0.0.0.0; "
                "the ports are PORT (web) and FLOWER_PORT"
            )
        problems = preflight.setup_problems(
            wanted,
            sqlite=connection.vendor == "sqlite",
            embedded_broker=settings.CLOCKQ_EMBEDDED_BROKER,
            admin_password_set=bool(settings.CLOCKQ_ADMIN_PASSWORD),
        )
        if problems:
            raise CommandError("refusing to start:\n  " + "\n  ".join(problems))
        for line in records.stop_leftovers(settings.VAR_DIR):
            self.stdout.write(line)
        self._check_ports(wanted, bind)
        protect_var_dir(settings.VAR_DIR)
        self._prepare_database(wanted)
        host = settings.CLOCKQ_HOST
        self._refuse_a_private_broker(wanted, host)
        registry.register_host(host, wanted.names, registry.broker_address(settings.REDIS_URL))
        self._check_checkpoint_folder(wanted, host)
        children = self._children(wanted, bind)
        keeper = self._claim_names(wanted, children)
        self.stdout.write(self._banner(wanted, bind))
        if "web" in wanted:
            web = f"http://{_shown_host(bind)}:{settings.PORT}"
            threading.Thread(target=self._announce_ready, args=(web, demo), daemon=True).start()
        stopped = threading.Event()
        threading.Thread(target=_say_host_is_live, args=(host, stopped), daemon=True).start()
        try:
            # The names are given up once the workers have stopped, and before the embedded
            # broker that holds them does.
            supervisor = Supervisor(
                children,
                stop_grace_s=60,
                before_last=keeper.stop,
                name="runstack",
                record_dir=records.record_dir(settings.VAR_DIR),
            )
            code = supervisor.run_forever()
        finally:
            stopped.set()
            keeper.stop()
        raise SystemExit(code)

    def _check_ports(self, wanted: preflight.Roles, bind: str) -> None:
        """The ports this start listens on, before the migrations: a taken one stops it at once,
        saying what holds it and which variable chooses another (clockq/stack/ports.py, which
        `make run` runs before it installs anything, and which picks the embedded Redis's port)."""
        needed = [r for r in ("web", "flower") if r in wanted]
        if wanted.whole and settings.CLOCKQ_EMBEDDED_BROKER:
            needed.append("redis")
        env = {**os.environ, "CLOCKQ_BIND": bind}
        found = ports.check_ports(env, settings.VAR_DIR, pick=False, roles=tuple(needed))
        if found.problems:
            raise CommandError("refusing to start: a port it needs is taken.\n  " + "\n  ".join(found.problems))

    def _prepare_database(self, wanted: preflight.Roles) -> None:
        """The web role migrates (one web host at a time) and ensures the admin user; the other
        roles wait until the database's schema is this code's."""
        if "web" in wanted:
            _migrate()
            call_command("ensureadmin")
            return
        self._wait_for(_unapplied_migrations, "the web role to migrate the database")

    def _refuse_a_private_broker(self, wanted: preflight.Roles, host: str) -> None:
        if connection.vendor == "sqlite":
            return  # this host's own database: no other host is on it (only --role all gets here)
        local = settings.CLOCKQ_EMBEDDED_BROKER or preflight.is_loopback(urlsplit(settings.REDIS_URL).hostname)
        others = [h.name for h in registry.live_hosts(besides=host)] if local else []
        problem = preflight.broker_problem(
            wanted, local_broker=local, broker=registry.broker_address(settings.REDIS_URL), others=others
        )
        if problem:
            raise CommandError(f"refusing to start: {problem}")

    def _check_checkpoint_folder(self, wanted: preflight.Roles, host: str) -> None:
        """The web role marks its checkpoint folder; the roles that write checkpoints must see
        that mark in theirs, or they would keep jobs' work where the others cannot find it."""
        folder = settings.CLOCKQ_CHECKPOINT_DIR
        if "web" in wanted:
            marker.write_marker(folder, host)
        if wanted.names & preflight.CHECKPOINT_ROLES:
            self._wait_for(lambda: marker.recorded() is None, "the web role to mark the checkpoint folder")
            if problem := marker.marker_problem(folder):
                raise CommandError(f"refusing to start: {problem}")

    def _wait_for(self, waiting: Callable[[], object], what: str) -> None:
        """Poll until `waiting()` is false, saying once what it waits for (and any database error)."""
        said = ""
        while True:
            try:
                if not waiting():
                    return
                message = f"waiting for {what}"
            except DatabaseError as exc:
                message = f"waiting for the database: {str(exc).strip()[:300]}"
                close_old_connections()
            except redis.RedisError as exc:
                message = f"waiting for the broker: {str(exc).strip()[:300]}"
            if message != said:
                self.stdout.write(message)
                said = message
            time.sleep(WAIT_POLL_S)

    def _children(self, wanted: preflight.Roles, bind: str) -> list[Child]:
        children: list[Child] = []
        env: dict[str, str] = {"CLOCKQ_HOST": settings.CLOCKQ_HOST}
        if wanted.whole and settings.CLOCKQ_EMBEDDED_BROKER:
            children.append(_embedded_redis())
        env["REDIS_URL"] = settings.REDIS_URL
        for role, name, port in (("web", "PORT", settings.PORT), ("flower", "FLOWER_PORT", settings.FLOWER_PORT)):
            if role in wanted and not port_is_free(port):
                raise CommandError(f"{name}={port} is taken; choose another port with {name}=...")
        if "web" in wanted:
            children.append(Child("web", roles.web_argv(bind, settings.PORT), restart=False))
        if "gpu" in wanted:
            children.append(Child("gpuworkers", roles.gpu_host_argv(), restart=False))
        if "control" in wanted:
            children.append(Child("control", roles.control_worker_argv()))
        if "predictor" in wanted:
            # Forecasts every minute and retrains hourly (beat sends both to its queue).
            children.append(Child("predictor", roles.predictor_worker_argv()))
        if "beat" in wanted:
            children.append(Child("beat", roles.beat_argv(), restart=False))
        if "flower" in wanted:
            password, _source = admin_password()
            # Through the environment, so the password never shows in `ps`.
            flower_env = {"FLOWER_BASIC_AUTH": f"{ADMIN_USERNAME}:{password}"}
            children.append(Child("flower", roles.flower_argv(bind, settings.FLOWER_PORT), flower_env, restart=False))
        for child in children:
            child.env = {**env, **child.env}
        return children

    def _claim_names(self, wanted: preflight.Roles, children: list[Child]) -> names.Keeper:
        """Hold the names of the control and predictor workers started here (the gpu role's
        `gpuworkers` holds its own): a live worker elsewhere with one of them stops this start."""
        held = {role: f"{role}@{settings.CLOCKQ_HOST}" for role in ("control", "predictor") if role in wanted}
        instance = names.new_instance()
        if held:
            if not any(c.name == "redis" for c in children):  # the private broker is not up yet
                try:
                    self._wait_for(lambda: _unreachable(client()), "the broker")
                    names.claim(client(), list(held.values()), instance)
                except names.NameTaken as exc:
                    raise CommandError(f"refusing to start: {exc}") from None
            for child in children:
                if child.name in held:
                    child.env[names.INSTANCE_ENV] = instance
        return names.Keeper(client, list(held.values()), instance).start()

    def _banner(self, wanted: preflight.Roles, bind: str) -> str:
        host = _shown_host(bind)
        web = f"http://{host}:{settings.PORT}"
        lines = [f"\nclockq is starting on {settings.CLOCKQ_HOST}: --role {wanted.describe()}"]
        if "web" in wanted:
            lines += [
                f"  web      {web}/jobs/   (submit: {web}/jobs/new)",
                f"  admin    {web}/admin/",
                f"  dashboard {web}/dashboard   (staff; Prometheus: {web}/metrics)",
                f"  API      {web}/api/jobs",
                f"  health   {web}/healthz",
            ]
        if "flower" in wanted:
            lines.append(f"  Flower   http://{host}:{settings.FLOWER_PORT}/")
        lines.append(f"  broker   {_without_password(settings.REDIS_URL)}")
        if "web" in wanted or "flower" in wanted:
            _password, source = admin_password()
            lines.append(f"  login    {ADMIN_USERNAME}, password in {source}   (also Flower's basic auth)")
        lines.append("Ctrl-C stops everything.\n")
        return "\n".join(lines)

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


def _migrate() -> None:
    """migrate, holding a PostgreSQL advisory lock, so that two web hosts starting together
    migrate one after the other (the second finds nothing to do)."""
    locked = connection.vendor == "postgresql"
    if locked:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [MIGRATE_LOCK_ID])
    try:
        call_command("migrate", interactive=False, verbosity=0)
    finally:
        if locked:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [MIGRATE_LOCK_ID])


def _unreachable(r: redis.Redis) -> bool:
    r.ping()  # raises while the broker does not answer
    return False


def _unapplied_migrations() -> int:
    executor = MigrationExecutor(connection)
    return len(executor.migration_plan(executor.loader.graph.leaf_nodes()))


def _say_host_is_live(host: str, stopped: threading.Event) -> None:
    """Refresh this host's `seen_at` while the launcher runs (clockq/fleet/registry.py)."""
    while not stopped.wait(registry.SEEN_EVERY_S):
        try:
            registry.seen(host)
        except DatabaseError as exc:
            log.warning("could not say that %s is live: %s", host, exc)
        finally:
            close_old_connections()


def _embedded_redis() -> Child:
    """A private Redis for this machine alone, restarted if it dies: it reloads its append-only
    file, and every client reconnects."""
    port = settings.EMBEDDED_REDIS_PORT
    if not port_is_free(port):
        raise CommandError(
            f"port {port} for the embedded Redis is taken; choose another with CLOCKQ_EMBEDDED_REDIS_PORT=..., "
            f"or set REDIS_URL (`make run` picks a free one and records it in var/{embedded_redis.RECORD_NAME})"
        )
    data = settings.VAR_DIR / "redis"
    data.mkdir(parents=True, exist_ok=True)
    broker_password = persistent_secret(settings.EMBEDDED_REDIS_PASSWORD_FILE, nbytes=24)
    return Child("redis", redis_server_argv(port, data, durable=True, password=broker_password), stop_last=True)


def _shown_host(bind: str) -> str:
    return "localhost" if bind in ("127.0.0.1", "0.0.0.0") else bind


def _is_address(bind: str) -> bool:
    """An IP address or a host name, without a port: `--bind 0.0.0.0:8000` would end in a web
    address with two ports and a Flower that cannot resolve its host."""
    try:
        ipaddress.ip_address(bind)
        return True
    except ValueError:
        return bool(bind) and ":" not in bind and not any(c.isspace() or c == "/" for c in bind)
