"""Exactly one beat: a lock in Redis with a lease (redis-py's Lock), renewed at every tick.

Two beats would send every periodic task twice. Each beat ticks; the one that holds the lock
renews it and sends what is due, the others only try to take it. The lock's value names its
holder (host, pid), so operators and tests can tell which beat leads. When the leading beat
dies, its lease runs out and a waiting beat takes the lock at its next try: within one lease
plus one try. A beat that stops gracefully gives the lock up at once.
"""

from __future__ import annotations

import logging
import os
import uuid

import redis
from redis.exceptions import LockError

log = logging.getLogger("clockq.beat")

LOCK_KEY = "clockq:beat:lock"


def holder_token(host: str) -> str:
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def leader(r: redis.Redis) -> str | None:
    """The token of the beat that leads now (host:pid:nonce), or None."""
    raw = r.get(LOCK_KEY)
    return raw.decode() if isinstance(raw, bytes) else raw


class BeatLock:
    def __init__(self, r: redis.Redis, lease_s: float, token: str):
        self.token = token
        self._lock = r.lock(LOCK_KEY, timeout=lease_s, blocking=False, thread_local=False)
        self.held = False

    def hold(self) -> bool:
        """Renew the lock if this beat holds it, else try to take it. Whether this beat leads."""
        try:
            if self.held:
                try:
                    self._lock.reacquire()
                    return True
                except LockError:
                    self.held = False
                    log.warning("beat %s lost its lock (its lease ran out); trying to take it again", self.token)
            self.held = bool(self._lock.acquire(token=self.token))
        except redis.RedisError as exc:
            # Without the broker no task can be sent anyway; a lease that ran out meanwhile is
            # found at the next renewal.
            log.warning("beat %s cannot reach the broker for its lock: %s", self.token, exc)
        return self.held

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        try:
            self._lock.release()
        except (LockError, redis.RedisError) as exc:
            log.warning("beat %s could not give up its lock: %s", self.token, exc)
