"""Ask GPU workers to stop or start taking jobs from the tier queues, as their drain says.

Celery's own remote control does it (a broadcast through the broker, handled by each named
worker's main process, which cancels or adds its queue consumers): a drained worker then no
longer pops messages, so they go to the other GPUs. The broadcast carries no state: each worker
reads its drain from the database (workers/drain.py), so a lost or repeated broadcast is
harmless, and the workers also compare every few seconds.
"""

from __future__ import annotations

import logging

from clockq.celery import app

log = logging.getLogger("clockq.fleet")

SYNC_DRAIN_COMMAND = "clockq_sync_drain"


def sync_drain(worker_names: list[str], timeout_s: float = 1.0) -> dict[str, str]:
    """Tell these workers to apply their drain now. Returns each answering worker's state
    (`drained` or `consuming`); a worker that is down or busy does not answer within
    `timeout_s`, and applies its drain when it starts or at its next heartbeat."""
    if not worker_names:
        return {}
    try:
        replies = app.control.broadcast(
            SYNC_DRAIN_COMMAND, destination=worker_names, reply=True, timeout=timeout_s, limit=len(worker_names)
        )
    except Exception as exc:  # the broker is down: each worker applies its drain when it can
        log.warning("could not ask %s to apply their drain: %s", ", ".join(worker_names), exc)
        return {}
    states: dict[str, str] = {}
    for reply in replies or []:
        for name, answer in reply.items():
            if isinstance(answer, dict) and isinstance(answer.get("state"), str):
                states[name] = answer["state"]
    return states
