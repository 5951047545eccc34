"""Cheap interrupts for a running slice, delivered through Redis pub/sub.

Checking the broker at every step would cost a round trip per step. Instead each worker
process keeps one subscriber thread that turns messages into in-memory flags, and the slice
loop checks the flags at every step (a few hundred nanoseconds):

- `rt`: an RT job was dispatched. A running job of a lower tier ends its slice at the next
  step instead of at the slice's end, so RT start latency is bounded by one step.
- `job <id>`: an operator changed a job (cancel, hold, requeue). The worker running it ends its
  slice at the next step and reads the job row.

Pub/sub is fire-and-forget: a lost message only means the ordinary slice boundary notices the
same thing a little later. Correctness never depends on it.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import redis
from django.conf import settings

log = logging.getLogger("clockq.signals")

CHANNEL = "clockq:signals"
# RT jobs dispatched that no worker has yet made way for (or claimed from idle). Every busy GPU
# hears the RT signal; this counter lets exactly one of them checkpoint for each RT job instead
# of all of them. It expires, so a miscount heals itself.
RT_UNCLAIMED_KEY = "clockq:rt:unclaimed"
RT_UNCLAIMED_TTL_S = 60
_TAKE_ONE = """
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n > 0 then redis.call('DECR', KEYS[1]) return 1 end
return 0
"""


def announce_rt_waiting(client: redis.Redis) -> None:
    try:
        pipe = client.pipeline(transaction=False)
        pipe.incr(RT_UNCLAIMED_KEY)
        pipe.expire(RT_UNCLAIMED_KEY, RT_UNCLAIMED_TTL_S)
        pipe.publish(CHANNEL, json.dumps({"kind": "rt"}))
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("could not announce an RT job: %s", exc)


def take_rt_job(client: redis.Redis) -> bool:
    """Take one unclaimed RT job: True means this worker is the one that makes way for it (or,
    claiming it from idle, the one that got it). Never blocks long: False on a broker error."""
    try:
        return bool(client.eval(_TAKE_ONE, 1, RT_UNCLAIMED_KEY))
    except redis.RedisError:
        return False


def announce_job_changed(client: redis.Redis, job_id: int) -> None:
    _publish(client, {"kind": "job", "job": int(job_id)})


def _publish(client: redis.Redis, message: dict) -> None:
    try:
        client.publish(CHANNEL, json.dumps(message))
    except redis.RedisError as exc:
        log.warning("could not publish %s: %s", message, exc)


class Interrupts:
    """Flags set by the subscriber thread, read by the slice loop."""

    def __init__(self) -> None:
        self.rt_waiting = threading.Event()
        self._poked: set[int] = set()
        self._lock = threading.Lock()

    def poke(self, job_id: int) -> None:
        with self._lock:
            self._poked.add(job_id)

    def should_end_slice(self, job_id: int, rank: int) -> bool:
        """True when the running slice should end at this step. Called at every step."""
        return self.rt_waits(rank) or (bool(self._poked) and job_id in self._poked)

    def rt_waits(self, rank: int) -> bool:
        """An RT job was announced since this job's last boundary, and the job is not RT."""
        return rank > 0 and self.rt_waiting.is_set()

    def clear_rt(self) -> None:
        """The broker said the announced RT jobs are taken (checked before a boundary)."""
        self.rt_waiting.clear()

    def clear(self, job_id: int) -> None:
        """Called at a slice boundary, once the worker has read the truth from the database."""
        self.rt_waiting.clear()
        with self._lock:
            self._poked.discard(job_id)

    def handle(self, raw: bytes | str) -> None:
        try:
            message = json.loads(raw)
            if message.get("kind") == "rt":
                self.rt_waiting.set()
            elif message.get("kind") == "job":
                self.poke(int(message["job"]))
        except (ValueError, TypeError, KeyError, AttributeError):
            log.warning("ignoring malformed signal %r", raw[:200] if isinstance(raw, bytes | str) else raw)


class Listener:
    """One daemon thread per process, subscribed to CHANNEL, reconnecting on failure."""

    def __init__(self, client_factory, interrupts: Interrupts):
        self.client_factory = client_factory
        self.interrupts = interrupts
        # Set once Redis has confirmed the subscription: from then on no signal is missed.
        self.subscribed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clockq-signals", daemon=True)

    def start(self) -> Listener:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                pubsub = self.client_factory().pubsub()
                pubsub.subscribe(CHANNEL)
                for message in pubsub.listen():
                    kind = message.get("type")
                    if kind == "message":
                        self.interrupts.handle(message["data"])
                    elif kind == "subscribe":
                        self.subscribed.set()
            except Exception as exc:  # keep listening whatever happens; signals are best effort
                self.subscribed.clear()
                log.warning("signal listener lost its connection (%s); reconnecting", exc)
                time.sleep(1.0)


_interrupts: Interrupts | None = None
_listener: Listener | None = None
_lock = threading.Lock()


def interrupts() -> Interrupts:
    """This process's flags, with the listener started on first use."""
    global _interrupts, _listener
    with _lock:
        if _interrupts is None:
            flags = Interrupts()
            _listener = Listener(_new_pubsub_client, flags).start()
            _interrupts = flags
        return _interrupts


def wait_until_listening(timeout_s: float) -> bool:
    """Start this process's listener if needed and wait until Redis confirms its subscription.

    A worker calls this before it claims a job: a signal published after the claim (an
    operator's hold, an RT job) then reaches it. Without it, the first job of a fresh worker
    could miss one and only notice at its slice boundary. False if the broker did not answer
    in time; the boundary check still catches up.
    """
    interrupts()
    assert _listener is not None
    return _listener.subscribed.wait(timeout_s)


def _new_pubsub_client() -> redis.Redis:
    # A dedicated connection without a socket timeout: listen() blocks between messages.
    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, health_check_interval=30)
