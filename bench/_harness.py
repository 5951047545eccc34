"""What only the benchmarks in bench/ need, on top of the child processes and waits they share with
the tests (bench/harness.py, which starts and stops every process): a private clockq to measure,
Celery's task events, and small statistics.

Every process is started in its own process group and stopped through that group only, so
nothing here touches a process it did not start.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent


def root_on_path() -> None:
    """Make clockq's packages importable when a script runs as `python bench/<script>.py`."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


root_on_path()
# The processes and waits are shared with the tests (bench/harness.py), which import them from
# bench, never the other way round: one harness for both.
from bench.harness import RedisServer as RedisServer  # noqa: E402
from bench.harness import Service as Service  # noqa: E402
from bench.harness import free_port as free_port  # noqa: E402
from bench.harness import wait_for as wait_for  # noqa: E402


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


def turn_ladder(slice_ms: float, slices: int, tier: str = "SP") -> str:
    """CLOCKQ_SERVICE_LADDER_S with a rung every 0.9 slice of `tier`'s service, for `slices`
    slices: two jobs of one tier sharing a GPU then take turns. Jobs of one class never displace
    one another (clockq/policy/ordering.py), so with the default ladder (minutes of GPU time)
    neither would make way; with this one the job that ran last passes a rung the waiting one
    has not, and yields to it, about every other boundary (A B B A A B B ...)."""
    from clockq.policy.ordering import Ladder
    from clockq.policy.tiers import TIER_BY_CODE

    spacing_s = 0.9 * slice_ms / 1000 / Ladder().weight(TIER_BY_CODE[tier].rank)
    rungs = math.ceil(slices / 0.9) + 4
    return ",".join(repr(round(spacing_s * (k + 1), 9)) for k in range(rungs))


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
        f"GPU worker {index}",
        argv,
        # Alone on its GPU unless the bench starts its RT lane too and says so (bench/rt_latency.py).
        {"CLOCKQ_RT_LANE": "off", **env, **gpu_worker_env(gpu)},
        ROOT,
        work / f"gpu{index}-worker.log",
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
