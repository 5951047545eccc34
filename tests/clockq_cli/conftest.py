"""The `clockq` command line as an operator runs it: a process of its own, against a live server
(pytest-django's live_server, on the test database) with a real API token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness import ROOT


@dataclass
class Ran:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


class Clockq:
    """Runs `python -m clockq_cli ARGS` with its own config folder, as `token`'s owner at `url`."""

    def __init__(self, *, url: str, token: str, config_home: Path, cwd: Path):
        self.url, self.token, self.config_home, self.cwd = url, token, config_home, cwd

    def env(self, **extra: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLOCKQ_")}
        env.update({"XDG_CONFIG_HOME": str(self.config_home), "CLOCKQ_URL": self.url, "CLOCKQ_TOKEN": self.token})
        env.update({"COLUMNS": "200", "PYTHONPATH": str(ROOT)})
        for key, value in extra.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def command(self) -> list[str]:
        return [sys.executable, "-m", "clockq_cli"]

    def __call__(self, *args: str, stdin: str = "", timeout: float = 60, **env: str | None) -> Ran:
        done = subprocess.run(
            [*self.command(), *args],
            cwd=self.cwd,
            env=self.env(**env),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return Ran(done.returncode, done.stdout, done.stderr)

    def popen(self, *args: str, **env: str | None) -> subprocess.Popen:
        return subprocess.Popen(
            [*self.command(), *args],
            cwd=self.cwd,
            env=self.env(**env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def api_token(user) -> str:
    from knox.models import AuthToken

    _instance, token = AuthToken.objects.create(user=user)
    return token


@pytest.fixture
def clockq(live_server, alice, tmp_path) -> Clockq:
    """`clockq` as alice, a user who is not staff."""
    work = tmp_path / "work"
    work.mkdir()
    return Clockq(url=live_server.url, token=api_token(alice), config_home=tmp_path / "config", cwd=work)


@pytest.fixture
def clockq_as_carol(live_server, carol, tmp_path) -> Clockq:
    """`clockq` as carol, staff: she sees every user's jobs."""
    return Clockq(url=live_server.url, token=api_token(carol), config_home=tmp_path / "config-carol", cwd=tmp_path)


def no_traceback(ran: Ran) -> None:
    """A failure says what in one line on stderr, never a Python traceback."""
    assert "Traceback" not in ran.err and "Traceback" not in ran.out, ran.err
    assert len(ran.err.strip().splitlines()) == 1, ran.err
