"""The Redis client every clockq process shares with the broker's Redis."""

from __future__ import annotations

from functools import cache

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry


@cache
def client() -> redis.Redis:
    # One immediate retry (a connection gone stale across a broker restart), no backoff: this
    # client is used at slice boundaries, where a dead broker must cost milliseconds, not the
    # seconds of redis-py's default retry policy.
    return redis.Redis.from_url(
        settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=2, retry=Retry(NoBackoff(), 1)
    )


def ping() -> bool:
    try:
        return bool(client().ping())
    except redis.RedisError:
        return False
