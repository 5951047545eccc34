"""One driver process of bench/control_plane.py: a share of the simulated GPU fleet.

Each simulated GPU is what a GPU worker process keeps (a `workers.runtime.Runtime`) and where
it stands: waiting for a message, running a job's slice, or at its boundary. Nothing blocks
for a slice: a heap of timers says when each GPU next acts, and a pool of threads (each with
its own database connection, as each worker has) runs the actions, so a few threads drive
hundreds of GPUs. The module docstring of bench/control_plane.py says what is clockq's own
code here and what stands in for Celery and for the GPU.

Run by the coordinator only: `python bench/_control_plane_fleet.py SPEC.json`. It writes
SPEC.ready once its GPUs are built, waits for SPEC.go (the phase's times), runs until the
measured window ends, and writes its samples to SPEC.out.
"""

from __future__ import annotations

import cProfile
import heapq
import itertools
import json
import logging
import os
import pstats
import random
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("bench.control_plane")

# kombu's Redis transport: a queue's list per priority step, and the separator in their names.
KOMBU_PRIORITY_STEPS = (0, 3, 6, 9)
KOMBU_SEP = "\x06\x16"
FETCH_TIMEOUT_S = 0.05  # an idle GPU's BRPOP waits this long before it is put back in line
MAX_FIRST_ERRORS = 5


@dataclass(frozen=True)
class FleetSpec:
    first_gpu: int  # this driver's GPUs are first_gpu .. first_gpu + gpus - 1 of the fleet
    gpus: int
    gpus_per_host: int
    slice_s: float
    switch_share: float  # the share of boundaries that yield (a switch); the rest continue
    threads: int
    celery_traffic: bool
    seed: int
    profile: str | None = None  # a file for the actions' cProfile statistics, all threads merged
    # Every timer of the fleet stretched by this factor (a cost phase): slices are given as they
    # are; heartbeats, lease renewals, Celery's heartbeat, the telemetry's interval, the live-GPU
    # count's and the tier rows' re-reads are made this many times less often.
    dilation: float = 1.0


class Samples:
    """Latencies (ms) and counts, kept only for what happens inside the measured window."""

    def __init__(self) -> None:
        self.window = (float("inf"), float("inf"))
        self.values: dict[str, list[float]] = defaultdict(list)
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.first_errors: list[str] = []
        self._lock = threading.Lock()

    def inside(self, at: float) -> bool:
        return self.window[0] <= at < self.window[1]

    def add(self, name: str, at: float, ms: float) -> None:
        if self.inside(at):
            with self._lock:
                self.values[name].append(ms)

    def count(self, name: str, at: float) -> None:
        if self.inside(at):
            with self._lock:
                self.counts[name] += 1

    def error(self, where: str, exc: BaseException) -> None:
        with self._lock:
            self.errors[f"{where}: {type(exc).__name__}"] += 1
            if len(self.first_errors) < MAX_FIRST_ERRORS:
                self.first_errors.append(f"{where}: {''.join(traceback.format_exception(exc))[-2000:]}")


class Timers:
    """When each GPU acts next (a heap), and the pool of threads that runs the actions. How late
    an action starts (`lag`) is how far the driver itself falls behind."""

    def __init__(self, threads: int, samples: Samples, profile: bool = False):
        self.samples = samples
        self.profiles: list[cProfile.Profile] | None = [] if profile else None
        self._local = threading.local()
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="fleet")
        self._heap: list[tuple[float, int, str, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self.stopped = False

    def at(self, when: float, kind: str, action: Callable[[], None]) -> None:
        with self._cv:
            heapq.heappush(self._heap, (when, next(self._seq), kind, action))
            self._cv.notify()

    def run_until(self, end: float) -> None:
        while True:
            with self._cv:
                while not self.stopped:
                    now = time.time()
                    if now >= end:
                        self.stopped = True
                    elif self._heap and self._heap[0][0] <= now:
                        break
                    else:
                        wait = min(end, self._heap[0][0] if self._heap else end) - now
                        self._cv.wait(max(wait, 0.0005))
                if self.stopped:
                    break
                when, _, kind, action = heapq.heappop(self._heap)
            self.pool.submit(self._run, when, kind, action)
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _run(self, when: float, kind: str, action: Callable[[], None]) -> None:
        started = time.time()
        self.samples.add("lag", started, (started - when) * 1000)
        if self.stopped:
            return
        profiler = self._profiler()
        try:
            if profiler is not None:
                profiler.runcall(action)
            else:
                action()
        except Exception as exc:
            self.samples.error(kind, exc)

    def _profiler(self) -> cProfile.Profile | None:
        """This thread's profiler, with --profile (cProfile sees one thread only)."""
        if self.profiles is None:
            return None
        profiler = getattr(self._local, "profiler", None)
        if profiler is None:
            profiler = self._local.profiler = cProfile.Profile(time.thread_time)  # CPU, not GIL waits
            self.profiles.append(profiler)
        return profiler


class CeleryTraffic:
    """What a Celery GPU worker adds to Redis around each task, written as kombu and Celery
    write it (not through them): the BRPOP over every priority list of the tier queues, the
    unacked bookkeeping of acks_late (ZADD + HSET at delivery, ZREM + HDEL at the ack), the
    task events of `-E` (received, started, succeeded) and the worker's heartbeat event."""

    def __init__(self, broker, enabled: bool):
        from clockq.policy.tiers import QUEUES_IN_ORDER

        self.broker = broker  # a client without clockq's short socket timeout: BRPOP blocks
        self.enabled = enabled
        self.keys = [q if pri == 0 else f"{q}{KOMBU_SEP}{pri}" for pri in KOMBU_PRIORITY_STEPS for q in QUEUES_IN_ORDER]
        self._event = json.dumps({"body": "x" * 600, "content-type": "application/json", "headers": {}})

    def fetch(self) -> tuple[bytes, str] | None:
        """The next message and its delivery tag, or None after FETCH_TIMEOUT_S."""
        popped = self.broker.brpop(self.keys, timeout=FETCH_TIMEOUT_S)
        if popped is None:
            return None
        queue, raw = popped
        tag = json.loads(raw)["properties"]["delivery_tag"]
        if self.enabled:
            pipe = self.broker.pipeline()  # kombu's QoS.append
            pipe.zadd("unacked_index", {tag: time.time()})
            pipe.hset("unacked", tag, json.dumps([raw.decode(), "", queue.decode()]))
            pipe.execute()
            self._publish("task.received")
            self._publish("task.started")
        return raw, tag

    def ack(self, tag: str) -> None:
        if self.enabled:
            pipe = self.broker.pipeline()  # kombu's QoS.ack
            pipe.zrem("unacked_index", tag)
            pipe.hdel("unacked", tag)
            pipe.execute()
            self._publish("task.succeeded")

    def heartbeat(self) -> None:
        if self.enabled:
            self._publish("worker.heartbeat")

    def _publish(self, routing_key: str) -> None:
        self.broker.publish(f"/0.celeryev/{routing_key}", self._event)


class Fleet:
    """This driver's GPUs, its timers and samples."""

    def __init__(self, spec: FleetSpec):
        import redis
        from django.conf import settings

        from clockq.bus.client import client

        self.spec = spec
        self.samples = Samples()
        self.timers = Timers(spec.threads, self.samples, profile=spec.profile is not None)
        broker = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=30, max_connections=spec.threads + 8)
        self.celery = CeleryTraffic(broker, spec.celery_traffic)
        self.redis = client()
        # Each worker's boundary reader thread writes the counters after a commit; one small
        # pool stands for them all here.
        self.reader = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fleet-reader")
        self.rng = random.Random(spec.seed)
        from _control_plane_gpu import SimGpu

        self.gpus = [SimGpu(self, spec.first_gpu + i) for i in range(spec.gpus)]

    def run(self, start: float, window: tuple[float, float]) -> dict:
        """Every GPU starts within the first slice after `start` (so their boundaries spread
        over the slice, as on a cluster), then runs until the window's end."""
        self.samples.window = window
        for gpu in self.gpus:
            gpu.schedule(start)
        cpu: dict[str, float] = {}
        marks = [
            threading.Timer(max(t - time.time(), 0), _note_cpu, (cpu, key)) for key, t in zip("ab", window, strict=True)
        ]
        for mark in marks:
            mark.start()
        self.timers.run_until(window[1])
        for mark in marks:
            mark.join()
        self.reader.shutdown(wait=True)
        if self.spec.profile and self.timers.profiles:
            merged = pstats.Stats(self.timers.profiles[0])
            for profiler in self.timers.profiles[1:]:
                merged.add(profiler)
            merged.dump_stats(self.spec.profile)
        s = self.samples
        return {
            "gpus": len(self.gpus),
            "values": s.values,
            "counts": dict(s.counts),
            "errors": dict(s.errors),
            "first_errors": s.first_errors,
            "cpu_s": cpu.get("b", 0.0) - cpu.get("a", 0.0),
            "pid": os.getpid(),
        }


def _note_cpu(into: dict[str, float], key: str) -> None:
    times = os.times()
    into[key] = times.user + times.system


def main(argv: list[str]) -> int:
    spec_path = Path(argv[0])
    spec = FleetSpec(**json.loads(spec_path.read_text()))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _harness  # puts the repository root on sys.path

    _harness.setup_django()
    from workers import runtime

    runtime.GPU_COUNT_TTL_S *= spec.dilation
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from clockq.bus import signals

    fleet = Fleet(spec)
    signals.wait_until_listening(5.0)  # once a process, as run_dispatch does before a claim
    spec_path.with_suffix(".ready").write_text("ready")
    go = spec_path.with_suffix(".go")
    _harness.wait_for(go.exists, 600, "the coordinator's go", interval=0.02)
    times = json.loads(go.read_text())
    result = fleet.run(times["start"], (times["from"], times["to"]))
    spec_path.with_suffix(".out").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
