"""Worker liveness in Redis: each worker refreshes a key with a short TTL.

/healthz and /api/queues read these keys; they work across hosts because every host shares
the broker. Celery's own `inspect ping` would need a broadcast round trip per request.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings

from clockq.bus import lanes, names
from clockq.bus.client import client

log = logging.getLogger("clockq.heartbeat")

KEY_PREFIX = "clockq:worker:"
RT_LANE_OF_ENV = "CLOCKQ_RT_LANE_OF"  # set on a GPU's RT lane: the name of the GPU's main worker
INTERVAL_S = 5
TTL_S = 15


def announce(r: redis.Redis, info: dict[str, Any]) -> None:
    """Say that the worker `info["hostname"]` is alive for the next TTL_S seconds."""
    r.set(KEY_PREFIX + info["hostname"], json.dumps(info), ex=TTL_S)


def start(
    hostname: str,
    gpu_index: int | None = None,
    on_beat: Callable[[], None] | None = None,
    status: Callable[[], dict[str, Any]] | None = None,
) -> threading.Thread:
    """Announce this worker process every INTERVAL_S seconds, from a daemon thread, for as long
    as the process lives; `on_beat` runs after each announcement (a GPU worker's parent
    publishes its GPU's telemetry there while idle). The announcement carries the service
    ladder this process orders jobs by, so that a client can tell which order a cluster runs
    (bench/replay_live.py refuses to compare with a simulator on another ladder). `status`
    adds what changes while it runs (a GPU worker: whether it takes jobs, see workers/drain.py)."""
    # A GPU's standby RT lane (workers/rt_lane.py) is no GPU of its own: it says which GPU it
    # serves, and counts nowhere as a GPU worker.
    lane_of = os.environ.get(RT_LANE_OF_ENV)
    lane = {"rt_lane_of": lane_of, "rt_lane_gpu": gpu_index} if lane_of else {}
    info = {
        "hostname": hostname,
        "gpu": None if lane_of else gpu_index,
        **lane,
        "pid": os.getpid(),
        "host": settings.CLOCKQ_HOST,
        "started": time.time(),
        "service_ladder_s": list(settings.CLOCKQ_SERVICE_LADDER_S),
    }

    # The launcher that claimed this worker's name (clockq/bus/names.py): the worker keeps it too,
    # so a name stays held while its worker lives, even if the launcher was killed.
    instance = os.environ.get(names.INSTANCE_ENV)

    def beat() -> None:
        while True:
            try:
                announce(client(), {**info, **(status() if status is not None else {})})
                if lane_of:
                    lanes.keep_idle(client(), hostname)
                if instance and not names.renew(client(), hostname, instance):
                    log.error("%s: another launcher holds this name; two workers may run under it", hostname)
                if on_beat is not None:
                    on_beat()
            except redis.RedisError as exc:
                log.warning("heartbeat for %s failed: %s", hostname, exc)
            time.sleep(INTERVAL_S)

    thread = threading.Thread(target=beat, name="clockq-heartbeat", daemon=True)
    thread.start()
    return thread


def consumes(worker: Any, queue: str) -> bool:
    """Whether the Celery worker `worker` (a worker_ready sender) consumes `queue`: each role
    starts its own heartbeat, recognised by the queues its command line gave it."""
    return queue in worker.app.amqp.queues.consume_from


def on_a_gpu(beat: dict[str, Any]) -> bool:
    """Whether a heartbeat is a GPU's main worker's or its RT lane's: what a drain applies to."""
    return beat.get("gpu") is not None or bool(beat.get("rt_lane_of"))


def live_workers() -> list[dict[str, Any]]:
    r = client()
    keys = sorted(r.scan_iter(match=KEY_PREFIX + "*", count=500))
    if not keys:
        return []
    return [json.loads(raw) for raw in r.mget(keys) if raw is not None]


def worker_info(hostname: str) -> dict[str, Any] | None:
    """One worker's latest heartbeat, or None when it is not live."""
    raw = client().get(KEY_PREFIX + hostname)
    return json.loads(raw) if raw is not None else None


DEGRADED_PREFIX = "clockq:degraded:"


def report_degraded(r: redis.Redis, hostname: str, reason: str, ttl_s: float) -> None:
    """Say that this worker cannot work normally (its checkpoint storage fails) and why. The key
    expires, so a worker that died degraded stops being reported."""
    r.set(DEGRADED_PREFIX + hostname, reason[:500], ex=max(int(ttl_s), 1))


def clear_degraded(r: redis.Redis, hostname: str) -> None:
    r.delete(DEGRADED_PREFIX + hostname)


def degraded_workers() -> dict[str, str]:
    """Worker hostname -> why it is degraded, across the cluster."""
    r = client()
    keys = sorted(r.scan_iter(match=DEGRADED_PREFIX + "*", count=500))
    if not keys:
        return {}
    return {_text(key)[len(DEGRADED_PREFIX) :]: _text(raw) for key, raw in zip(keys, r.mget(keys), strict=True) if raw}


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
