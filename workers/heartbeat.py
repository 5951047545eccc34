"""Worker liveness in Redis: each GPU worker refreshes a key with a short TTL.

/healthz and /api/queues read these keys; they work across hosts because every host shares
the broker. Celery's own `inspect ping` would need a broadcast round trip per request.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

import redis

from workers import broker, telemetry

log = logging.getLogger("clockq.heartbeat")

KEY_PREFIX = "clockq:worker:"
INTERVAL_S = 5
TTL_S = 15


def start(hostname: str, gpu_index: int | None, probe: telemetry.Probe | None = None) -> threading.Thread:
    """Refresh this worker's key; a GPU worker also publishes its GPU's telemetry while idle
    (the pool process publishes while a slice runs)."""
    info = {
        "hostname": hostname,
        "gpu": gpu_index,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.time(),
    }

    def beat() -> None:
        while True:
            try:
                broker.client().set(KEY_PREFIX + hostname, json.dumps(info), ex=TTL_S)
                if probe is not None:
                    telemetry.publish(broker.client(), probe.sample(), only_if_absent=True)
            except redis.RedisError as exc:
                log.warning("heartbeat for %s failed: %s", hostname, exc)
            time.sleep(INTERVAL_S)

    thread = threading.Thread(target=beat, name="clockq-heartbeat", daemon=True)
    thread.start()
    return thread


def live_workers() -> list[dict]:
    r = broker.client()
    keys = sorted(r.scan_iter(match=KEY_PREFIX + "*", count=500))
    if not keys:
        return []
    return [json.loads(raw) for raw in r.mget(keys) if raw is not None]
