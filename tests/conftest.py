"""Shared fixtures: a private Redis for the whole session, personas, and real GPU workers."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.cache import cache

from tests import db_engine
from tests.harness import ROOT, GpuWorkers, RedisServer, can_sandbox, private_network_problem
from tests.helpers import SHORT_LADDER, database_url


def pytest_configure(config):
    """The tests that press Ctrl-C on a program (SIGINT to `clockq jobs --watch`) need it to hear
    it: a run started in the background by a shell without job control (`nohup ... &`, as a CI
    runner may) ignores SIGINT, and every process it starts would inherit that and go on for the
    whole wait. A handler of our own is not inherited: the programs get the default back."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    """Mark the tests that CI's PostgreSQL pass runs (`-m db_engine`, tests/db_engine.py says which)."""
    for item in items:
        path = item.path.relative_to(ROOT).as_posix()
        if db_engine.depends_on_the_engine(path, item.fixturenames, (m.name for m in item.iter_markers())):
            item.add_marker(db_engine.MARKER)


def pytest_unconfigure(config):
    """At the very end of the run. pytest-django has deleted the SQLite test database, but not its
    -wal and -shm files, which stay behind when a thread of an in-process worker (a Runtime's
    reader or persister) still held a connection (4 MB a run, in var/). They go here."""
    # The signal listener (a daemon thread) keeps reconnecting to the private Redis, stopped by now,
    # and would log so into streams that pytest has closed ("--- Logging error ---").
    logging.getLogger("clockq.signals").disabled = True
    db = django_settings.DATABASES["default"]
    test_db = db.get("TEST", {}).get("NAME")
    if db["ENGINE"].endswith("sqlite3") and test_db and not os.path.exists(test_db):
        for suffix in ("-wal", "-shm"):
            Path(test_db + suffix).unlink(missing_ok=True)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session", autouse=True)
def _point_at_private_redis(redis_server):
    """Every test process talks to the private Redis, never to one it did not start."""
    from clockq.bus.client import client
    from clockq.celery import app

    django_settings.REDIS_URL = redis_server.url
    app.conf.broker_url = redis_server.url
    client.cache_clear()
    yield


@pytest.fixture(scope="session", autouse=True)
def _programs_run_as_uids_of_this_process():
    """Under pytest-xdist (`make test` runs two test processes), each test process gives its jobs'
    programs uids that no other one gives: a job's uid is CLOCKQ_COMMAND_UID_BASE plus its id, and
    each process's database numbers its jobs from 1, so a test counting the processes of its job's
    uid would count the other process's program too. The workers it starts inherit the base."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...; unset without xdist
    if not worker.startswith("gw"):
        yield
        return
    base = django_settings.CLOCKQ_COMMAND_UID_BASE + (int(worker[2:]) + 1) * 10_000_000
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(django_settings, "CLOCKQ_COMMAND_UID_BASE", base)
        mp.setenv("CLOCKQ_COMMAND_UID_BASE", str(base))
        yield


@pytest.fixture
def crossable_dir():
    """A temporary folder that other users can cross but not list (0711), like var/ under
    `make run`: a sandboxed program's uid must reach its work folder inside it. pytest's own
    tmp_path lives under a 0700 folder."""
    path = Path(tempfile.mkdtemp(prefix="clockq-test-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _flush_in_process_runtimes(crossable_dir, monkeypatch):
    """A worker Runtime that a test builds in its own process writes a yielded job's checkpoint in
    the background, after the switch: it is written before the test's folders are removed (this
    is torn down before crossable_dir), not into a folder it would make again under /tmp."""
    from workers.runtime import Runtime

    made: list[Runtime] = []
    real_init = Runtime.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(Runtime, "__init__", init)
    yield
    for runtime in made:
        runtime.persister.flush(timeout=10)


@pytest.fixture(autouse=True)
def _clean_slate(request, redis_server, crossable_dir, settings):
    from clockq.bus.client import client

    client().flushall()
    cache.clear()  # throttle counters
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins
    settings.CLOCKQ_CHECKPOINT_DIR = crossable_dir / "checkpoints"
    settings.CLOCKQ_ALLOW_SAME_USER_COMMANDS = os.geteuid() != 0  # as root, commands are sandboxed
    # Test programs are copied into crossable_dir, under /tmp, which a sandboxed program does
    # not see: show it (read-only; the checkpoint store in it stays hidden).
    settings.CLOCKQ_COMMAND_READ_PATHS = [str(crossable_dir)]
    # Where bubblewrap cannot run (not installed, no user namespaces), the protocol's tests run
    # programs unsandboxed; the sandbox's own tests skip, saying why.
    settings.CLOCKQ_COMMAND_SANDBOX = "bwrap" if can_sandbox() else "none"
    # Likewise their network: their own where slirp4netns can make it (the default), else none.
    settings.CLOCKQ_COMMAND_NETWORK = "none" if private_network_problem() else "private"
    # Test jobs run for milliseconds to seconds: a ladder on that scale, so that the order by
    # attained service shows in a test (start_workers passes it on to the workers).
    settings.CLOCKQ_SERVICE_LADDER_S = SHORT_LADDER
    marker = request.node.get_closest_marker("django_db")
    if marker or {"db", "transactional_db"} & set(request.fixturenames):
        # Transactional tests flush every table, the seeded tiers included.
        from clockq.jobs.models import QueueTier
        from clockq.jobs.tiers import ensure_default_tiers

        wants_tx = (marker and marker.kwargs.get("transaction")) or "transactional_db" in request.fixturenames
        request.getfixturevalue("transactional_db" if wants_tx else "db")
        ensure_default_tiers(QueueTier)
        if not wants_tx:
            # A test in a transaction finds the periodic tasks the migrations seed (only the
            # missing ones are made, inside its transaction). In one process pytest-django runs
            # these tests before the transactional ones, whose flush deletes them; under
            # pytest-xdist a process may already have run a transactional test of another file.
            from django_celery_beat.models import IntervalSchedule, PeriodicTask

            from clockq.jobs.periodic import ensure_periodic_tasks

            ensure_periodic_tasks(PeriodicTask, IntervalSchedule)


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", password="alice-pass-123")


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user("bob", password="bob-pass-123")


@pytest.fixture
def operator(django_user_model):
    """Staff with the permission to run their own programs (the command workload)."""
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("oscar", password="oscar-pass-123", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="run_command"))
    return django_user_model.objects.get(pk=user.pk)


@pytest.fixture
def carol(django_user_model):
    """Staff."""
    return django_user_model.objects.create_user("carol", password="carol-pass-123", is_staff=True)


@pytest.fixture
def start_workers(transactional_db, redis_server, settings, tmp_path):
    """Start `manage.py gpuworkers` with N simulated GPUs; stopped after the test."""
    started: list[GpuWorkers] = []

    def start(gpus: int = 1, **env: str) -> GpuWorkers:
        workers = GpuWorkers(
            env={
                "DATABASE_URL": database_url(),
                "CLOCKQ_CHECKPOINT_DIR": str(settings.CLOCKQ_CHECKPOINT_DIR),
                "CLOCKQ_ALLOW_SAME_USER_COMMANDS": "1" if settings.CLOCKQ_ALLOW_SAME_USER_COMMANDS else "0",
                "CLOCKQ_COMMAND_READ_PATHS": ",".join(settings.CLOCKQ_COMMAND_READ_PATHS),
                "CLOCKQ_COMMAND_SANDBOX": settings.CLOCKQ_COMMAND_SANDBOX,
                "CLOCKQ_COMMAND_NETWORK": settings.CLOCKQ_COMMAND_NETWORK,
                "CLOCKQ_LOG_LEVEL": "INFO",
                "CLOCKQ_SERVICE_LADDER_S": ",".join(repr(r) for r in settings.CLOCKQ_SERVICE_LADDER_S),
                # A GPU's main worker alone, as these tests mean it (RT through the checkpoint
                # path); the tests of RT lanes ask for them, and the stack's tests get the default.
                "CLOCKQ_RT_LANE": "off",
                **env,
            },
            gpus=gpus,
            log_path=tmp_path / f"workers-{len(started)}.log",
        )
        started.append(workers)
        return workers.start(redis_server.url)

    yield start
    for workers in started:
        workers.stop()
        # Shown only when the test fails.
        print(f"--- {workers.log_path.name} (tail) ---")
        print(workers.log_path.read_text(errors="replace")[-6000:])


class LogRecords(logging.Handler):
    """Records what a logger emits. clockq's loggers do not propagate (settings.LOGGING), so
    caplog would miss them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def warnings(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == logging.WARNING]


@pytest.fixture
def log_records():
    return LogRecords()


@pytest.fixture
def telemetry_log(log_records):
    """What the `clockq.telemetry` logger (probes, sampler, GPU sample publishing) emits."""
    logger = logging.getLogger("clockq.telemetry")
    logger.addHandler(log_records)
    yield log_records
    logger.removeHandler(log_records)


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A real 2 MiB tmpfs, to fill up. Mounting needs root (CI runs as root); elsewhere the
    tests that need it are skipped, saying why."""
    import subprocess

    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()[:200]}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
