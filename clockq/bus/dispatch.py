"""The dispatch message: (job id, dispatch token) and nothing else. It is only a wake-up."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from clockq.bus import signals
from clockq.bus.client import client
from clockq.celery import app
from clockq.policy.tiers import QUEUES_IN_ORDER

log = logging.getLogger("clockq.dispatch")

RUN_SLICE_TASK = "clockq.run_slice"
# Publishing must not hang a web request or a slice boundary when the broker is down or paused:
# the job is already queued in the database and the reconciler re-sends it. One immediate retry
# (a pooled connection gone stale across a broker restart); each try gives up after
# CLOCKQ_BROKER_TIMEOUT_S.
_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0, "interval_max": 0}


def send_run_slice(job_id: int, token: str, queue_name: str, producer=None) -> None:
    # With a queue and no exchange, Celery publishes on the anonymous exchange straight into
    # the queue's list. That needs no exchange binding in Redis, so a broker that restarted
    # empty takes messages at once instead of dropping them until a worker declares again.
    app.send_task(
        RUN_SLICE_TASK,
        args=[job_id, token],
        queue=queue_name,
        retry=True,
        retry_policy=_RETRY_POLICY,
        producer=producer,
    )


def publish_dispatch(job_id: int, token: str, queue_name: str) -> bool:
    """Send the wake-up message. A failure is logged, not raised: the job is queued in the
    database, and the reconciler sends it again once the broker is back."""
    return publish_dispatches([(job_id, token, queue_name)]) == 1


def publish_dispatches(messages: Sequence[tuple[int, str, str]]) -> int:
    """publish_dispatch for several (job id, token, queue) at once (a batch submit): one broker
    connection, and one Redis pipeline for all of them (kombu's Producer.batch). Returns how many
    were sent. A failure is logged, not raised, as publish_dispatch's: the jobs are queued in the
    database and the reconciler sends them again (a message sent twice is only a stale one)."""
    rt_jobs = 0
    try:
        with app.producer_or_acquire() as producer, producer.batch():
            for job_id, token, queue_name in messages:
                send_run_slice(job_id, token, queue_name, producer=producer)
                rt_jobs += queue_name == QUEUES_IN_ORDER[0]
    except Exception as exc:  # the broker may be down; the database already holds the truth
        first = messages[0][0] if messages else None
        log.warning(
            "dispatch of %d job(s) (from job %s) failed (%s); the reconciler will retry", len(messages), first, exc
        )
        return 0
    for _ in range(rt_jobs):
        # Running slices of lower tiers end at their next step instead of their slice end.
        signals.announce_rt_waiting(client())
    return len(messages)
