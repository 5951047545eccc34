"""Cheap interrupts for a running slice, delivered through Redis pub/sub.

Checking the broker at every step would cost a round trip per step. Instead each worker
process keeps one subscriber thread that turns messages into in-memory flags, and the slice
loop checks the flags at every step (a few hundred nanoseconds):

- `urgent <rank>`: a job of a tier that interrupts (`ordering.interrupts`: RT and HP) was
  dispatched. A running job that such a job could displace (`ordering.may_interrupt`) asks the
  order at its next step whether it is the one to make way (`making_way.makes_way_for`), and
  leaves its GPU only if so: the policy, not the first worker to hear, names the victim.
- `job <id>`: an operator changed a job (cancel, hold, requeue). The worker running it ends its
  slice at the next step and reads the job row.
- `lane <worker>`: the pause request of a GPU's standby RT lane for its main worker `worker`
  changed (clockq/bus/lanes.py). The message carries no request: the key is the only truth, and
  the worker reads it at its next step (workers/run/pause.py).
- `fleet`: an operator drained or resumed a GPU or a host. Each worker process reads its drain
  again before its next claim (workers/drain.py).

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


def announce_urgent(client: redis.Redis, rank: int) -> None:
    """A job of a tier that interrupts (rank `rank`) waits: every busy GPU hears it."""
    _publish(client, {"kind": "urgent", "rank": int(rank)})


def announce_job_changed(client: redis.Redis, job_id: int) -> None:
    _publish(client, {"kind": "job", "job": int(job_id)})


def announce_fleet_changed(client: redis.Redis) -> None:
    _publish(client, {"kind": "fleet"})


def announce_lane(client: redis.Redis, worker: str) -> None:
    """The pause request for the main worker `worker` changed: it reads the key again."""
    _publish(client, {"kind": "lane", "worker": worker})


def _publish(client: redis.Redis, message: dict) -> None:
    try:
        client.publish(CHANNEL, json.dumps(message))
    except redis.RedisError as exc:
        log.warning("could not publish %s: %s", message, exc)


class Interrupts:
    """Flags set by the subscriber thread, read by the slice loop."""

    def __init__(self) -> None:
        # Set while an urgent job was announced and not yet looked at (`take_urgent`).
        self.urgent = threading.Event()
        self._urgent_rank: int | None = None  # the most urgent tier announced since
        self._poked: set[int] = set()
        self._lock = threading.Lock()
        # Set when a drain or resume was announced: the worker reads its drain again.
        self.fleet_changed = threading.Event()
        # Main workers whose RT lane's pause request changed since they last read it
        # (clockq/bus/lanes.py): a hint to read the key, never the request itself.
        self._lane_hints: set[str] = set()
        self.lane_changed = threading.Event()

    def heard_urgent(self, rank: int) -> None:
        with self._lock:
            self._urgent_rank = rank if self._urgent_rank is None else min(rank, self._urgent_rank)
            self.urgent.set()

    def take_urgent(self) -> int | None:
        """The most urgent tier announced since the last look, and forget it: the caller looks."""
        if not self.urgent.is_set():
            return None
        with self._lock:
            rank, self._urgent_rank = self._urgent_rank, None
            self.urgent.clear()
        return rank

    def poke(self, job_id: int) -> None:
        with self._lock:
            self._poked.add(job_id)

    def poked(self, job_id: int) -> bool:
        """An operator changed this job since its last boundary. Called at every step."""
        return bool(self._poked) and job_id in self._poked

    def pending(self, job_id: int) -> bool:
        """Something was signalled that a read made before now could have missed."""
        return self.urgent.is_set() or self.poked(job_id)

    def clear(self, job_id: int) -> None:
        """Called at a slice boundary, once the worker has read the truth from the database."""
        with self._lock:
            self._urgent_rank = None
            self.urgent.clear()
            self._poked.discard(job_id)

    def heard_lane(self, worker: str) -> None:
        with self._lock:
            self._lane_hints.add(worker)
        self.lane_changed.set()

    def lane_hinted(self, worker: str) -> bool:
        """Whether the pause request for the main worker `worker` may have changed since it was
        last read (`take_lane_hint`)."""
        return worker in self._lane_hints

    def take_lane_hint(self, worker: str) -> bool:
        """`lane_hinted`, and forget the hint: the caller reads the key now, so a change after
        this call hints again. Called at every step: a set lookup while nothing was heard."""
        if worker not in self._lane_hints:
            return False
        with self._lock:
            self._lane_hints.discard(worker)
        return True

    def handle(self, raw: bytes | str) -> None:
        try:
            message = json.loads(raw)
            if message.get("kind") == "urgent":
                self.heard_urgent(int(message["rank"]))
            elif message.get("kind") == "job":
                self.poke(int(message["job"]))
            elif message.get("kind") == "lane":
                self.heard_lane(str(message["worker"]))
            elif message.get("kind") == "fleet":
                self.fleet_changed.set()
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
                        # A drain announced while this was not listening would be missed.
                        self.interrupts.fleet_changed.set()
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
