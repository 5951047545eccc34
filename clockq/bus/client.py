"""The Redis client every clockq process shares with the broker's Redis."""

from __future__ import annotations

from functools import cache

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry


@cache
def client() -> redis.Redis:
    # Used at slice boundaries and in web requests, where a dead or paused broker must cost a
    # fraction of a second (CLOCKQ_BROKER_TIMEOUT_S), not the seconds of redis-py's defaults. One
    # immediate retry, on a connection gone stale across a broker restart, but not on a timeout.
    timeout = settings.CLOCKQ_BROKER_TIMEOUT_S
    return redis.Redis.from_url(
        settings.REDIS_URL,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
    )


def ping() -> bool:
    try:
        return bool(client().ping())
    except redis.RedisError:
        return False
