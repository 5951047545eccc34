"""The dispatch message: (job id, dispatch token) and nothing else. It is only a wake-up.

The tier travels as the queue the message is pushed onto: a queue is its tier's, one to one
(`TierSpec.queue_name`), so the message needs no rank of its own, and a message of any version
in flight during an upgrade reads the same (the design's invariant 1: the database is the
truth). What the sender needs of the tier (whether it interrupts) is the definition's, read by
the queue's name (`TIER_BY_QUEUE`), not by its place in a list.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis

from clockq.bus import celery_message, signals
from clockq.bus.client import client
from clockq.celery import app
from clockq.policy.tiers import TIER_BY_QUEUE

log = logging.getLogger("clockq.dispatch")

RUN_SLICE_TASK = celery_message.TASK_NAME


def send_run_slice(job_id: int, token: str, queue_name: str, pipe: redis.client.Pipeline | None = None) -> None:
    """Push the wake-up onto the tier's queue, or onto `pipe` to be sent with others. With a
    queue and no exchange, Celery publishes on the anonymous exchange straight into the queue's
    list, and so does this (clockq/bus/celery_message.py says why not send_task). That needs no
    exchange binding in Redis, so a broker that restarted empty takes messages at once instead
    of dropping them until a worker declares again. The client's timeout keeps a dead or paused
    broker from hanging a web request or a slice boundary (CLOCKQ_BROKER_TIMEOUT_S), and it
    retries once, on a pooled connection gone stale across a broker restart."""
    message = celery_message.encode(job_id, token, queue_name, reply_to=app.thread_oid)
    (pipe if pipe is not None else client()).lpush(queue_name, message)


def publish_dispatch(job_id: int, token: str, queue_name: str) -> bool:
    """Send the wake-up message. A failure is logged, not raised: the job is queued in the
    database, and the reconciler sends it again once the broker is back."""
    return publish_dispatches([(job_id, token, queue_name)]) == 1


def publish_dispatches(messages: Sequence[tuple[int, str, str]]) -> int:
    """publish_dispatch for several (job id, token, queue) at once (a batch submit): one Redis
    pipeline for all of them. Returns how many were sent. A failure is logged, not raised, as
    publish_dispatch's: the jobs are queued in the database and the reconciler sends them again
    (a message sent twice is only a stale one)."""
    try:
        pipe = client().pipeline(transaction=False)  # as quick as a lone LPUSH for one message
        for job_id, token, queue_name in messages:
            send_run_slice(job_id, token, queue_name, pipe=pipe)
        pipe.execute()
    except Exception as exc:  # the broker may be down; the database already holds the truth
        first = messages[0][0] if messages else None
        log.warning(
            "dispatch of %d job(s) (from job %s) failed (%s); the reconciler will retry", len(messages), first, exc
        )
        return 0
    tiers = [TIER_BY_QUEUE.get(queue) for _, _, queue in messages]
    urgent = [t.rank for t in tiers if t is not None and t.interrupts]
    if urgent:
        # A job that makes its victim leave at once (RT, HP): each busy GPU it could displace
        # asks the order at its next step whether it is the victim. One signal for a batch.
        signals.announce_urgent(client(), min(urgent))
    return len(messages)
