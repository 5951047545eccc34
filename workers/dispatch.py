"""The dispatch message: (job id, dispatch token) and nothing else. It is only a wake-up."""

from __future__ import annotations

from clockq.celery import app

RUN_SLICE_TASK = "clockq.run_slice"
# Publishing must not hang a web request or a slice boundary when the broker is down: the job
# is already queued in the database and the reconciler re-sends it.
_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


def send_run_slice(job_id: int, token: str, queue_name: str) -> None:
    # With a queue and no exchange, Celery publishes on the anonymous exchange straight into
    # the queue's list. That needs no exchange binding in Redis, so a broker that restarted
    # empty takes messages at once instead of dropping them until a worker declares again.
    app.send_task(RUN_SLICE_TASK, args=[job_id, token], queue=queue_name, retry=True, retry_policy=_RETRY_POLICY)
