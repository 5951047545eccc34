"""What a user and an operator notice across a restart and in the log: sessions survive a restart,
two clockqs on one machine keep apart cookies, /healthz's 503 while starting is no ERROR, and
Celery's per-task lines are DEBUG."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from tests.harness import ROOT

LOG_IN = """
from django.contrib.auth import get_user_model
from django.test import Client
alice = get_user_model().objects.create_user("alice", password="alice-pass-123")
client = Client()
client.force_login(alice)  # a session in the database, its cookie signed as a login's
(name, morsel), = client.cookies.items()
print(name, morsel.value)
"""
# A fresh process: what a restarted web server is.
VISIT = """
import os
from django.conf import settings
from django.test import Client
client = Client()
client.cookies[os.environ["TEST_COOKIE_NAME"]] = os.environ["TEST_COOKIE_VALUE"]
answer = client.get("/jobs/")
print(answer.status_code, settings.SESSION_COOKIE_NAME)
"""


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else ""


def machine(var_dir) -> dict[str, str]:
    """A single machine's settings: no SECRET_KEY, no DATABASE_URL, its own var/."""
    drop = ("SECRET_KEY", "SECRET_KEY_FILE", "DATABASE_URL", "REDIS_URL")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "CLOCKQ_VAR_DIR": str(var_dir), "ALLOWED_HOSTS": "testserver"}


@pytest.mark.slow  # about a minute: clockq started and restarted, twice over; CI's slow pass runs it
@pytest.mark.integration
def test_a_session_survives_a_restart_and_another_clockq_uses_other_cookies(tmp_path):
    # Given a machine without SECRET_KEY, where alice logged in
    env = machine(tmp_path / "var")
    manage(env, "migrate", "--verbosity", "0")
    name, value = manage(env, "shell", "-c", LOG_IN).split()
    key_file = tmp_path / "var" / "secret_key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    # When the web server restarts (a new process reads the settings afresh)
    cookie = {"TEST_COOKIE_NAME": name, "TEST_COOKIE_VALUE": value}
    status, cookie_name = manage({**env, **cookie}, "shell", "-c", VISIT).split()
    # Then her session still holds: the jobs page, not the login page
    assert (status, cookie_name) == ("200", name)
    # And a second clockq on the same machine names its cookies otherwise, so neither logs out the other
    other = machine(tmp_path / "other-var")
    other_name = manage(other, "shell", "-c", "from django.conf import settings; print(settings.SESSION_COOKIE_NAME)")
    assert other_name.startswith("clockq_session_") and other_name != name
    # And an explicit SECRET_KEY still wins over the kept one
    explicit = {**env, **cookie, "SECRET_KEY": "k" * 48}
    status, _ = manage(explicit, "shell", "-c", VISIT).split()
    assert status == "302"  # another key, another cookie name: logged out, as its operator chose


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def request_log():
    logger = logging.getLogger("django.request")
    handler = Records()
    logger.addHandler(handler)
    yield handler.records
    logger.removeHandler(handler)


@pytest.mark.django_db
def test_healthz_answering_503_while_starting_logs_no_error(client, request_log):
    # No GPU worker is up yet: the system cannot run jobs, as at every start
    answer = client.get("/healthz")
    assert answer.status_code == 503
    about_health = [r for r in request_log if "/healthz" in r.getMessage()]
    assert [r.levelname for r in about_health] == ["INFO"]
    assert not [r for r in request_log if r.levelno >= logging.ERROR]


def test_other_server_errors_keep_their_level():
    from clockq.logs import HealthAnswerFilter

    class Request:
        path = "/api/jobs"

    record = logging.LogRecord("django.request", logging.ERROR, __file__, 1, "Service Unavailable", (), None)
    record.status_code, record.request = 503, Request()
    assert HealthAnswerFilter().filter(record) and record.levelno == logging.ERROR
    Request.path, record.status_code = "/healthz", 500
    assert HealthAnswerFilter().filter(record) and record.levelno == logging.ERROR


def test_celerys_per_task_lines_are_debug_unless_asked_for():
    assert logging.getLogger("celery.app.trace").getEffectiveLevel() == logging.WARNING
    assert logging.getLogger("celery.worker.strategy").getEffectiveLevel() == logging.WARNING
