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
