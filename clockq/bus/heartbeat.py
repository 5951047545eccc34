"""Worker liveness in Redis: each worker refreshes a key with a short TTL.

/healthz and /api/queues read these keys; they work across hosts because every host shares
the broker. Celery's own `inspect ping` would need a broadcast round trip per request.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from clockq.bus.client import client

KEY_PREFIX = "clockq:worker:"
INTERVAL_S = 5
TTL_S = 15


def announce(r: redis.Redis, info: dict[str, Any]) -> None:
    """Say that the worker `info["hostname"]` is alive for the next TTL_S seconds."""
    r.set(KEY_PREFIX + info["hostname"], json.dumps(info), ex=TTL_S)


def live_workers() -> list[dict[str, Any]]:
    r = client()
    keys = sorted(r.scan_iter(match=KEY_PREFIX + "*", count=500))
    if not keys:
        return []
    return [json.loads(raw) for raw in r.mget(keys) if raw is not None]
