"""Re-dispatch queued jobs whose wake-up message is gone from the broker.

A message can vanish: a broker restarted empty, a publish failed while the broker was down, a
worker died between taking a message and claiming its job. The database still says `queued`,
so the job would wait forever. Each pass compares the database with the broker and sends a
fresh message, with a new token, for every job that has none. The new token makes any old
message stale, so a job is never run twice even if the old message turns up again.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from clockq.bus import queues
from clockq.jobs.models import Job
from clockq.jobs.transitions import transition
from clockq.policy.states import JobState
from clockq.policy.tiers import QUEUES_IN_ORDER, tier

log = logging.getLogger("clockq.reconcile")

FULL_SCAN_LIMIT = 20_000


def reconcile_queued_jobs() -> int:
    """One pass. Returns how many jobs were dispatched again."""
    grace = timedelta(seconds=settings.CLOCKQ_REDISPATCH_GRACE_S)
    # Read the database first: a job queued after this read is not a candidate, and one
    # dispatched within the grace period may still have its message in flight.
    candidates = [
        (job_id, token, tier(code).queue_name, enqueued_at)
        for job_id, token, code, enqueued_at in Job.objects.filter(
            state=JobState.QUEUED, dispatched_at__lt=timezone.now() - grace
        )
        .order_by("enqueued_at", "id")
        .values_list("id", "dispatch_token", "tier__code", "enqueued_at")
    ]
    if not candidates:
        return 0
    tier_queues = list(QUEUES_IN_ORDER)
    in_flight = queues.recently_delivered(settings.CLOCKQ_REDISPATCH_GRACE_S)
    lengths = dict(zip(tier_queues, queues.waiting_by_rank(tier_queues), strict=True))
    wanted = Counter(queue for _id, _token, queue, _at in candidates)

    present: set[tuple[int, str]] = set()
    for queue in tier_queues:
        present |= in_flight.get(queue, set())
        if not wanted[queue]:
            continue
        if lengths[queue] > FULL_SCAN_LIMIT and lengths[queue] >= wanted[queue]:
            # Too long to read on every pass, and long enough to hold every candidate. Stale
            # messages could mask a missing one for a while; it is found once they drain.
            present.update((job_id, token) for job_id, token, q, _ in candidates if q == queue)
            continue
        present.update(queues.queued_messages(queue))

    redispatched = 0
    for job_id, token, queue, enqueued_at in candidates:
        if (job_id, token) in present:
            continue
        job = transition(
            job_id,
            to=JobState.QUEUED,
            expect={JobState.QUEUED},
            token=token,
            rotate_token=True,
            reason=f"dispatch message missing from queue {queue!r}; sent again",
            actor="reconciler",
            updates={"enqueued_at": enqueued_at},
        )
        if job is not None:
            redispatched += 1
    if redispatched:
        log.warning("re-dispatched %s queued job(s) whose messages were missing", redispatched)
    return redispatched
