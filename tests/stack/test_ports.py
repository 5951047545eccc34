"""The ports `make run` needs, checked before the install (clockq/stack/ports.py): a taken one is
named with its variable and what holds it; a taken embedded Redis port is replaced by a free one,
recorded in var/redis.url, where settings, manage.py and Celery's CLI read it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest

from clockq import embedded_redis
from clockq.stack import ports
from tests.harness import ROOT, free_port, wait_for

SCRIPT = str(ROOT / "clockq" / "stack" / "ports.py")


@contextmanager
def held_port() -> Iterator[int]:
    """A port this test listens on, as another clockq or any other server would."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def clean_env(var_dir, **extra: str) -> dict[str, str]:
    """This checkout's environment without a broker or database of its own, on free ports."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL", "CLOCKQ_EMBEDDED_REDIS_PORT")}
    return {**env, "CLOCKQ_VAR_DIR": str(var_dir), "PORT": str(free_port()), "FLOWER_PORT": str(free_port()), **extra}


def run_check(env: dict[str, str]) -> subprocess.CompletedProcess:
    # -I -S: no site-packages at all, as the system's python3 runs it before the virtualenv exists.
    return subprocess.run(
        [sys.executable, "-I", "-S", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("variable", "what"),
    [("PORT", "the web server"), ("FLOWER_PORT", "Flower"), ("CLOCKQ_EMBEDDED_REDIS_PORT", "the embedded Redis")],
)
def test_a_taken_port_stops_the_start_naming_the_port_its_variable_and_its_holder(tmp_path, variable, what):
    # Given a port this test listens on, named by one of make run's variables
    with held_port() as port:
        chosen = {"CLOCKQ_EMBEDDED_REDIS_PORT": str(free_port()), variable: str(port)}
        # When make run's check runs with the standard library alone
        result = run_check(clean_env(tmp_path, **chosen))
    # Then it fails, saying which port, which variable chooses another, and what holds it
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{variable}={port} ({what}) is taken by pid {os.getpid()} (" in result.stderr
    assert f"{variable}=" in result.stderr.split("is taken", 1)[1]
    assert not (tmp_path / embedded_redis.RECORD_NAME).exists()  # an explicit port is never moved


def test_free_ports_pass_quietly(tmp_path):
    result = run_check(clean_env(tmp_path, CLOCKQ_EMBEDDED_REDIS_PORT=str(free_port())))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_a_taken_embedded_redis_port_is_replaced_and_recorded_where_settings_and_celery_read_it(tmp_path):
    # Given var/redis.url recording a port that another server holds
    with held_port() as port:
        embedded_redis.record_port(tmp_path, port)
        env = clean_env(tmp_path)
        # When make run's check runs
        result = run_check(env)
        # Then it picks a free port, records it, and says so
        assert result.returncode == 0, result.stderr
        picked = embedded_redis.recorded_port(tmp_path)
        assert picked is not None and picked != port and ports.port_is_free(picked)
        assert f"port {port} for the embedded Redis" in result.stdout and f"using {picked}" in result.stdout
    assert (tmp_path / embedded_redis.RECORD_NAME).stat().st_mode & 0o777 == 0o600

    # And manage.py's settings and Celery's CLI find the broker there without a variable
    shown = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", "from django.conf import settings; print(settings.REDIS_URL)"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert urlsplit(shown.stdout.splitlines()[-1]).port == picked, shown.stderr
    report = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "clockq", "report"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    broker = next(line for line in report.stdout.splitlines() if line.startswith("CELERY_BROKER_URL"))
    assert f"@127.0.0.1:{picked}/0" in broker

    # And an explicit REDIS_URL still wins over the record
    explicit = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", "from django.conf import settings; print(settings.REDIS_URL)"],
        cwd=ROOT,
        env={**env, "REDIS_URL": "redis://broker.internal:6379/0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert explicit.stdout.splitlines()[-1] == "redis://broker.internal:6379/0", explicit.stderr


def test_a_malformed_record_is_refused_saying_what_to_do(tmp_path):
    (tmp_path / embedded_redis.RECORD_NAME).write_text("6391\n")
    result = run_check(clean_env(tmp_path))
    assert result.returncode == 2 and "delete it to pick again" in result.stderr


def test_runstack_refuses_a_taken_port_before_it_migrates(tmp_path):
    # Given the web port held by another server
    with held_port() as port:
        env = clean_env(tmp_path, PORT=str(port), CLOCKQ_EMBEDDED_REDIS_PORT=str(free_port()))
        # When the launcher starts (as make run's last step, or by hand)
        result = subprocess.run(
            [sys.executable, "manage.py", "runstack"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
    # Then it stops, naming the port and its variable, before the database exists
    assert result.returncode != 0
    assert f"PORT={port} (the web server) is taken by pid {os.getpid()}" in result.stderr
    assert not (tmp_path / "clockq.sqlite3").exists()


def test_an_earlier_starts_embedded_redis_still_running_stops_the_start_instead_of_a_second_one(tmp_path):
    # Given the embedded Redis of an earlier start, still running on the recorded port with its
    # files in this var folder (its make run was killed, say)
    from clockq.bus.redis_server import redis_server_argv

    port, data = free_port(), tmp_path / "redis"
    data.mkdir()
    embedded_redis.record_port(tmp_path, port)
    server = subprocess.Popen(redis_server_argv(port, data, durable=True), stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: not ports.port_is_free(port), 30, "the old Redis to listen")
        # When make run's check runs
        result = run_check(clean_env(tmp_path))
    finally:
        server.terminate()
        server.wait(timeout=30)
    # Then it stops, naming the process to stop, rather than start a second Redis on its files
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"earlier start of this clockq, still running (pid {server.pid}" in result.stderr
    assert f"kill {server.pid}" in result.stderr
    assert embedded_redis.recorded_port(tmp_path) == port  # the record is left as it was
