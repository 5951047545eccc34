"""Queue depth, longest waits and the load index every 5 seconds, for the last hour.

The KPI rollup samples the queue depth once a minute and the load history records the load index
once a minute: a burst that comes and goes between two samples never shows in either. Prometheus,
scraping /metrics every few seconds, sees it. So does this ring: the beat task
"clockq: queue sample" (every STEP_S, on the control queue) calls `record_queue_sample`, which
counts the waiting jobs in the database and keeps the figures in Redis (clockq.bus.sample_ring):

- Redis, not a table: a write every 5 s of a few hundred bytes that is worth keeping for an hour
  is what Redis's sorted sets are for; a table would grow by 17,000 rows a day, to be deleted.
  Older windows use the minute series (the KPI rollup, the load history), kept for days.
- One beat sends the task (control/beat.py); on any host, any control worker may run it. The
  ring keeps one sample per 5 s slot, whoever writes it, so a doubled or re-delivered tick, or
  two hosts running the same tick, never counts twice. Every host reads the same ring.
- The figures are /metrics' own definitions, read the same way: the depth is the jobs queued per
  their own tier (as the KPI rollup counts it; a promoted job still counts in the tier it came
  from), the wait is that of the longest-waiting job not started yet, from submission
  (clockq_queue_oldest_wait_seconds), and the load index is clockq/policy/load.py's over the GPU
  workers alive now.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import Count, Min, Q
from django.utils import timezone

from clockq.bus import heartbeat
from clockq.bus.client import client
from clockq.bus.sample_ring import SampleRing
from clockq.jobs.models import Job, QueueTier
from clockq.policy import load
from clockq.policy.states import JobState

STEP_S = 5
KEEP_S = 65 * 60  # the dashboard's 1 h window, with a few minutes to spare
RING = SampleRing("clockq:samples:queues", step_s=STEP_S, keep_s=KEEP_S, max_samples=2 * KEEP_S // STEP_S)
# GPUs each waiting or running job asks for, as the load history counts them.
GPUS_PER_JOB = 1


@dataclass(frozen=True)
class QueueSample:
    at: datetime  # the start of its 5 s slot
    queued: dict[str, int]  # tier code -> jobs queued, per own tier
    oldest_wait_s: dict[str, float]  # tier code -> the longest wait of a job not started yet; 0: none
    running: int  # jobs running
    gpus: int  # GPU workers alive
    load_index: float | None  # None without a live GPU worker

    def as_values(self) -> dict[str, Any]:
        return {
            "queued": self.queued,
            "oldest_wait_s": self.oldest_wait_s,
            "running": self.running,
            "gpus": self.gpus,
            "load_index": self.load_index,
        }

    @classmethod
    def from_stored(cls, stored: dict[str, Any]) -> QueueSample:
        """A sample as the ring holds it; raises ValueError on anything malformed (another host
        wrote it)."""
        try:
            return cls(
                at=datetime.fromtimestamp(stored["t"], tz=UTC),
                queued={str(code): _count(n) for code, n in stored["queued"].items()},
                oldest_wait_s={str(code): _seconds(s) for code, s in stored["oldest_wait_s"].items()},
                running=_count(stored["running"]),
                gpus=_count(stored["gpus"]),
                load_index=None if stored["load_index"] is None else _seconds(stored["load_index"]),
            )
        except (KeyError, AttributeError, TypeError) as exc:
            raise ValueError(f"not a queue sample: {exc!r}") from None


def take_sample(now: datetime | None = None) -> QueueSample:
    """The queues as the database has them now, placed in now's slot. Three grouped queries
    over the state index, and one Redis read (the live workers)."""
    now = now or timezone.now()
    codes = dict(QueueTier.objects.values_list("id", "code"))
    waiting = (
        Job.objects.filter(state=JobState.QUEUED)
        .order_by()
        .values_list("original_tier_id")
        .annotate(n=Count("id"), since=Min("submitted_at", filter=Q(first_started_at__isnull=True)))
    )
    queued: dict[str, int] = dict.fromkeys(codes.values(), 0)
    oldest: dict[str, float] = dict.fromkeys(codes.values(), 0.0)
    for tier_id, n, since in waiting:
        code = codes.get(tier_id)
        if code is None:
            continue
        queued[code] = n
        if since is not None:
            oldest[code] = round(max((now - since).total_seconds(), 0.0), 3)
    running = Job.objects.filter(state=JobState.RUNNING).count()
    gpus = sum(1 for w in heartbeat.live_workers() if w.get("gpu") is not None)
    return QueueSample(
        at=datetime.fromtimestamp(RING.slot(now.timestamp()), tz=UTC),
        queued=queued,
        oldest_wait_s=oldest,
        running=running,
        gpus=gpus,
        load_index=load.load_index(GPUS_PER_JOB * running, GPUS_PER_JOB * sum(queued.values()), gpus),
    )


def record_queue_sample(now: datetime | None = None) -> QueueSample:
    """What the beat task does: take the sample of now's slot and keep it in the ring (replacing
    one already there). Raises redis.RedisError when the broker does not answer."""
    now = now or timezone.now()
    sample = take_sample(now)
    RING.write(client(), now.timestamp(), sample.as_values())
    return sample


def queue_series(since: datetime, until: datetime) -> list[QueueSample]:
    """The samples whose slot starts in [since, until], oldest first; malformed ones are left
    out. Raises redis.RedisError when the broker does not answer."""
    return list(_valid(RING.read(client(), since.timestamp(), until.timestamp())))


def covers(seconds: float) -> bool:
    """Whether the ring keeps a window this long (older windows use the minute series)."""
    return seconds <= KEEP_S


def _valid(stored: Iterable[dict[str, Any]]) -> Iterable[QueueSample]:
    for item in stored:
        try:
            yield QueueSample.from_stored(item)
        except ValueError:
            continue


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"expected a count, got {value!r}")
    return value


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise TypeError(f"expected a non-negative number, got {value!r}")
    return float(value)
