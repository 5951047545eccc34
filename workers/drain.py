"""A GPU worker's drain (clockq/fleet/drains.py), as the worker applies it.

- Its main process stops or starts consuming the tier queues as the database says: when it
  starts (before it takes a message), when asked by a broadcast (clockq/bus/consumers.py), and
  at each heartbeat, which catches a broadcast it missed.
- Its pool process refuses a claim while drained, for the moment between a drain and the main
  process applying it: the job goes back to its queue, for a GPU that is not drained.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.worker.control import control_command
from django.db import close_old_connections

from clockq.bus import consumers, lanes
from clockq.bus.signals import Interrupts
from clockq.celery import app
from clockq.fleet import registry
from clockq.policy.tiers import QUEUES_IN_ORDER, REALTIME_QUEUES

log = logging.getLogger("clockq.drain")

REREAD_S = 30.0  # a pool process reads its drain at least this often, besides the announcements


def is_drained(hostname: str) -> bool:
    close_old_connections()  # the main process's threads keep their connection between reads
    return registry.is_drained(hostname)


def queues_of(hostname: str) -> tuple[str, ...]:
    """The tier queues a GPU worker takes jobs from: all five, or only RT's for a GPU's RT lane."""
    return REALTIME_QUEUES if lanes.main_of(hostname) is not None else QUEUES_IN_ORDER


def consuming(consumer: Any) -> bool:
    """Whether this Celery consumer takes jobs from any of its tier queues."""
    task_consumer = getattr(consumer, "task_consumer", None)
    return task_consumer is not None and any(task_consumer.consuming_from(q) for q in queues_of(consumer.hostname))


def is_gpu_worker(consumer: Any) -> bool:
    """A GPU's main worker, or its RT lane (drained with it)."""
    return consumer.hostname.startswith(lanes.MAIN_PREFIX) or lanes.main_of(consumer.hostname) is not None


def apply(consumer: Any, drained: bool) -> str:
    """Stop or start consuming its tier queues, in the main process's own thread. Added back
    in tier order, so the strict order of the queues is kept."""
    task_consumer = consumer.task_consumer
    for queue in queues_of(consumer.hostname):
        if drained and task_consumer.consuming_from(queue):
            consumer.cancel_task_queue(queue)
        elif not drained and not task_consumer.consuming_from(queue):
            consumer.add_task_queue(queue)
    return "drained" if drained else "consuming"


def apply_at_start(consumer: Any) -> None:
    """At worker_ready, before the event loop pops its first message."""
    try:
        if is_drained(consumer.hostname):
            apply(consumer, drained=True)
            log.warning("%s is drained: it takes no job until resumed", consumer.hostname)
    except Exception as exc:  # the database is down: the heartbeat's check applies it later
        log.warning("%s: cannot read its drain at start (%s)", consumer.hostname, exc)


@control_command(name=consumers.SYNC_DRAIN_COMMAND)
def _sync_drain(state, **_kwargs) -> dict[str, str]:
    consumer = state.consumer
    if not is_gpu_worker(consumer):
        return {"state": "not a GPU worker"}
    drained = is_drained(consumer.hostname)
    # In the event loop's next turn, as Celery's own cancel_consumer does: not in the middle of
    # the broker read that delivered this command.
    consumer.call_soon(apply, consumer, drained)
    return {"state": "drained" if drained else "consuming"}


class DrainWatch:
    """The heartbeat's check, in the main process's heartbeat thread: if what the worker does
    differs from its drain, it asks itself (a broadcast, handled in the consumer's own thread,
    which is the one allowed to change its consumers)."""

    def __init__(self, consumer: Any):
        self.consumer = consumer

    def check(self) -> None:
        try:
            drained = is_drained(self.consumer.hostname)
        except Exception as exc:
            log.warning("%s: cannot read its drain (%s)", self.consumer.hostname, exc)
            return
        if drained == consuming(self.consumer):
            try:
                app.control.broadcast(consumers.SYNC_DRAIN_COMMAND, destination=[self.consumer.hostname], reply=False)
            except Exception as exc:  # the broker is down; the next heartbeat tries again
                log.warning("%s: could not ask itself to apply its drain (%s)", self.consumer.hostname, exc)

    def status(self) -> dict[str, Any]:
        """What the heartbeat announces: whether the worker takes jobs now."""
        return {"consuming": consuming(self.consumer)}


class DrainFlag:
    """A pool process's view of its worker's drain, read again when a drain or resume is
    announced (pub/sub) and at least every REREAD_S: a claim costs nothing otherwise."""

    def __init__(self, hostname: str, interrupts: Interrupts):
        self.hostname = hostname
        self.interrupts = interrupts
        self._drained = False
        self._read_at = -1e9

    def drained(self) -> bool:
        changed = self.interrupts.fleet_changed.is_set()
        if changed or time.monotonic() - self._read_at > REREAD_S:
            self.interrupts.fleet_changed.clear()
            try:
                self._drained = registry.is_drained(self.hostname)
            except Exception as exc:  # keep what it was; the claim's own writes meet the fault
                log.warning("%s: cannot read its drain (%s)", self.hostname, exc)
            self._read_at = time.monotonic()
        return self._drained

    def ask_main_process(self) -> None:
        """A drained worker's pool process got a message: the main process has not applied the
        drain yet (its broadcast was lost, or came just now). Ask it again."""
        try:
            app.control.broadcast(consumers.SYNC_DRAIN_COMMAND, destination=[self.hostname], reply=False)
        except Exception as exc:
            log.warning("%s: could not ask itself to apply its drain (%s)", self.hostname, exc)
