"""Real services for tests: real GPU workers, beat and Flower, on the child processes and waits
that the benchmarks share (bench/harness.py: free_port, wait_for, Service, RedisServer, which this
module passes on); events a test watches; processes and the sandbox.

Each is started on a free local port or in its own process group, and stopped afterwards.
Nothing here touches a process it did not start.
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import redis

# The shared half: the tests import these from here as before; the benchmarks from bench/harness.py.
from bench.harness import ROOT as ROOT
from bench.harness import RedisServer as RedisServer
from bench.harness import Service as Service
from bench.harness import free_port as free_port
from bench.harness import wait_for as wait_for


class WatchedEvent(threading.Event):
    """A threading.Event that tells when a thread starts waiting on it (`waited`, and
    `on_wait()` called) and whether a wait ran out (`timed_out`): put in place of an event the
    code waits on, it shows the code got there, with no sleep to give it time."""

    def __init__(self, on_wait: Callable[[], object] | None = None):
        super().__init__()
        self.waited = threading.Event()
        self.timed_out = threading.Event()
        self.on_wait = on_wait

    def wait(self, timeout: float | None = None) -> bool:
        self.waited.set()
        if self.on_wait is not None:
            self.on_wait()
        done = super().wait(timeout)
        if not done:
            self.timed_out.set()
        return done


class GpuWorkers(Service):
    """`manage.py gpuworkers` with simulated GPUs: the real launcher and real Celery workers."""

    def __init__(self, env: dict[str, str], gpus: int, log_path: Path):
        argv = [sys.executable, "manage.py", "gpuworkers", "--stop-grace", "20"]
        super().__init__("gpuworkers", argv, {**os.environ, **env, "CLOCKQ_GPUS": f"sim:{gpus}"}, ROOT, log_path)
        self.gpus = gpus

    def start(self, redis_url: str, timeout: float = 60) -> GpuWorkers:
        self.env["REDIS_URL"] = redis_url
        super().start()
        client = redis.Redis.from_url(redis_url)
        host = self.env.get("CLOCKQ_HOST") or socket.gethostname()
        keys = [f"clockq:worker:gpu{i}@{host}" for i in range(self.gpus)]

        def ready():
            self.check_alive()
            return client.exists(*keys) == len(keys)

        wait_for(ready, timeout, interval=0.1, what="GPU workers to be ready")
        return self

    def worker_pids(self) -> list[int]:
        """PIDs of the Celery worker processes (children of gpuworkers)."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def stop(self, grace_s: float = 40.0) -> None:
        super().stop(grace_s)


def fill(directory, name: str = "filler") -> None:
    """Fill the filesystem holding `directory` to the last byte."""
    import errno

    with open(directory / name, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    # Byte-sized writes take the partial page that is left.
    with open(directory / f"{name}-tail", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0")
        except OSError:
            pass


ZOMBIE = ("Z", "X")  # process states of the dead that are still listed


def process_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name: state, parent, process group, ...
    None once the process is gone. A zombie (state Z or X) is dead but still listed."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def is_alive(pid: int) -> bool:
    """Whether `pid` is a live process; a zombie left for its parent to reap counts as dead."""
    fields = process_stat(pid)
    return fields is not None and fields[0] not in ZOMBIE


def sandbox_problem() -> str:
    """Why this machine cannot sandbox jobs' programs with bubblewrap; '' when it can."""
    from django.conf import settings

    from workers import sandbox

    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not installed (make test installs it where it may: apt-get install bubblewrap)"
    uid = settings.CLOCKQ_COMMAND_UID_BASE if os.geteuid() == 0 else None
    problem = sandbox.bwrap_problem(bwrap, uid)
    return f"this machine cannot make the sandbox's namespaces: {problem}" if problem else ""


def can_sandbox() -> bool:
    return not sandbox_problem()


@functools.cache
def private_network_problem() -> str:
    """Why this machine cannot give programs a network of their own (slirp4netns, as the jobs'
    uids); '' when it can. Where it cannot, the suite's programs get CLOCKQ_COMMAND_NETWORK=none
    (tests/conftest.py) and the tests of the private network itself are skipped, saying why."""
    from django.conf import settings

    from workers.program_network import tun_problem

    if shutil.which("slirp4netns") is None:
        return "slirp4netns is not installed (make test installs it where it may: apt-get install slirp4netns)"
    problem = tun_problem(settings.CLOCKQ_COMMAND_UID_BASE if os.geteuid() == 0 else None)
    return f"slirp4netns cannot make a program's network here: {problem}" if problem else ""


def needs_private_network():
    import pytest

    problem = private_network_problem()
    return pytest.mark.skipif(bool(problem), reason=problem or "-")


def needs_sandbox():
    """Skip a test of the sandbox itself where this machine cannot make one, or where, not being
    root, it cannot give programs a uid of their own."""
    import pytest

    problem = "a program gets a uid of its own only under a root worker" if os.geteuid() != 0 else sandbox_problem()
    return pytest.mark.skipif(bool(problem), reason=problem or "-")


def processes_of(uid: int) -> list[int]:
    """The live processes whose real uid is `uid`: a job's program and all it started, since
    each running program has a uid of its own."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue  # gone meanwhile
        line = next((x for x in status.splitlines() if x.startswith("Uid:")), "")
        if line.split()[1:2] == [str(uid)] and is_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def program_python() -> str:
    """A Python a sandboxed program can run: the system's. The sandbox hides clockq's folder,
    where the venv lives, and as root programs run as a uid of their own, which cannot reach an
    interpreter under /root (pyenv's). Where there is none, this one."""
    system = "/usr/bin/python3"
    return system if os.access(system, os.X_OK) else sys.executable


def shared_copy(source: Path, folder: Path) -> str:
    """Copy a test program into `folder` (crossable), readable by every user; returns its path."""
    target = folder / source.name
    shutil.copyfile(source, target)
    target.chmod(0o644)
    return str(target)


class Beat:
    """Celery beat on django-celery-beat's DatabaseScheduler, and the control worker that runs
    its tasks: the real processes `make run` starts, on the test's database and broker, writing
    to one log."""

    def __init__(self, env: dict[str, str], workdir: Path, loglevel: str = "INFO"):
        self.env = env
        self.workdir = workdir
        self.loglevel = loglevel  # DEBUG: beat logs each look at its schedule ("beat: Waking up")
        self.services: list[Service] = []
        self.log_path = workdir / "beat.log"

    def start(self, redis_url: str) -> Beat:
        from clockq.stack.roles import beat_argv, control_worker_argv

        env = {**os.environ, **self.env, "REDIS_URL": redis_url}
        # --max-interval: how often beat looks at the table for edits (DatabaseScheduler: 5 s).
        beat = [*beat_argv(self.loglevel), "--max-interval", "1"]
        beat += ["--pidfile", str(self.workdir / "beat.pid"), "--schedule", str(self.workdir / "beat-schedule")]
        for name, argv in (("control worker", control_worker_argv()), ("beat", beat)):
            self.services.append(Service(name, argv, env, ROOT, self.log_path).start())
        return self

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        for service in self.services:
            service.stop(grace_s=20)
        self.services = []


class FlowerServer(Service):
    """`python -m clockq.flower`, as `make run` starts it, on a free port with basic-auth `logins`."""

    def __init__(self, logins: dict[str, str], log_path: Path):
        from clockq.stack.roles import flower_argv

        self.port = free_port()
        argv = flower_argv("127.0.0.1", self.port)
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWER_")}
        env["FLOWER_BASIC_AUTH"] = ",".join(f"{u}:{p}" for u, p in logins.items())
        super().__init__("Flower", argv, env, ROOT, log_path)

    def start(self, redis_url: str, timeout: float = 60) -> FlowerServer:
        self.env["REDIS_URL"] = redis_url
        super().start()

        def answers():
            self.check_alive()
            try:
                return self.get("/healthcheck")[0] == 200
            except OSError:
                return False

        wait_for(answers, timeout, interval=0.1, what="Flower to answer")
        return self

    def get(self, path: str, login: tuple[str, str] | None = None, method: str = "GET"):
        """(status, headers, body text) of one request, with `login` as basic auth."""
        import base64
        import urllib.error
        import urllib.request

        headers = {}
        if login:
            headers["Authorization"] = "Basic " + base64.b64encode(":".join(login).encode()).decode()
        data = b"" if method == "POST" else None
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.headers, response.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, exc.read().decode(errors="replace")

    def stop(self, grace_s: float = 20.0) -> None:
        super().stop(grace_s)
