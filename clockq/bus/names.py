"""Worker names held by one launcher at a time, so two hosts never run workers of one name.

Two hosts that call themselves the same (CLOCKQ_HOST, or the same hostname) would otherwise run
two `gpu0@<host>`: their heartbeats overwrite each other's, and the reaper, seeing a lease of
"gpu0@<host>" that the other one stopped renewing, takes a live worker's job back.

A launcher (`gpuworkers`, `runstack` for the control and predictor workers) claims each name
before it starts the worker: a key in Redis holding the launcher's identity, with a TTL, renewed
by the launcher and by the worker's own heartbeat (children get the identity in CLOCKQ_INSTANCE).
A name held by someone else is watched for one TTL: if its holder renews it, the holder is alive
and the launcher refuses to start; if it expires (the holder died), the launcher takes it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable

import redis

log = logging.getLogger("clockq.names")

KEY_PREFIX = "clockq:name:"
TTL_S = 15
RENEW_EVERY_S = 5
INSTANCE_ENV = "CLOCKQ_INSTANCE"

# Renew the name if this holder has it, take it if nobody has; 0 if another holder has it.
_RENEW = """
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then return redis.call('EXPIRE', KEYS[1], ARGV[2]) end
if not held then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) return 1 end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class NameTaken(Exception):
    """A live worker elsewhere holds the name."""


def new_instance() -> str:
    """This launcher's identity: unique, and saying where it runs, for the refusal's message."""
    return json.dumps(
        {"id": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(), "since": round(time.time())},
        sort_keys=True,
    )


def describe(instance: str | bytes) -> str:
    try:
        info = json.loads(instance)
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(info["since"]))
        return f"a launcher on machine {info['host']!r} (pid {info['pid']}, since {since} UTC)"
    except (ValueError, KeyError, TypeError):
        return "another launcher"


def renew(r: redis.Redis, name: str, instance: str) -> bool:
    """Keep `name` for `instance` one more TTL; False if another holder has it."""
    return bool(r.eval(_RENEW, 1, KEY_PREFIX + name, instance, TTL_S))


def release(r: redis.Redis, names: Iterable[str], instance: str) -> None:
    for name in names:
        r.eval(_RELEASE, 1, KEY_PREFIX + name, instance)


def claim(
    r: redis.Redis,
    names: list[str],
    instance: str,
    *,
    on_wait: Callable[[str, str], None] = lambda name, holder: None,
    poll_s: float = 0.25,
) -> None:
    """Take every name for `instance`, or raise NameTaken naming the first one a live holder
    renews. A name whose holder has died is free within one TTL: its key expires."""
    for name in names:
        if renew(r, name, instance):
            continue
        key = KEY_PREFIX + name
        holder = r.get(key)
        on_wait(name, describe(holder or b""))
        last_ttl = r.pttl(key)
        deadline = time.monotonic() + TTL_S + RENEW_EVERY_S
        while True:
            time.sleep(poll_s)
            if renew(r, name, instance):
                break
            ttl = r.pttl(key)
            if ttl > last_ttl or time.monotonic() > deadline:
                raise NameTaken(
                    f"{name} is held by a live worker: {describe(r.get(key) or b'')} renews it. Two hosts "
                    "cannot share a name: set CLOCKQ_HOST to a name of this host's own"
                )
            last_ttl = ttl


class Keeper:
    """Renews a launcher's names every RENEW_EVERY_S from a daemon thread, and gives them up
    when stopped. A name another holder has taken meanwhile (this one lost the broker for a
    whole TTL) is reported, loudly, at every renewal."""

    def __init__(self, client_factory: Callable[[], redis.Redis], names: list[str], instance: str):
        self.client_factory = client_factory
        self.names = names
        self.instance = instance
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clockq-names", daemon=True)

    def start(self) -> Keeper:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(RENEW_EVERY_S):
            for name in self.names:
                try:
                    if not renew(self.client_factory(), name, self.instance):
                        log.error("%s is now held by another launcher: two workers may run under this name", name)
                except redis.RedisError as exc:
                    log.warning("could not renew the name %s: %s", name, exc)

    def stop(self) -> None:
        """Stop renewing and give the names up; once (a second call does nothing)."""
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            release(self.client_factory(), self.names, self.instance)
        except redis.RedisError as exc:
            log.warning("could not give up the names %s: %s", ", ".join(self.names), exc)
