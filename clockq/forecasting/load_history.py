"""The load history: one MetricSample per interval, what the load predictor learns from.

A beat task ("clockq: load sample", every CLOCKQ_LOAD_SAMPLE_EVERY_S) calls `sample_load`,
which records a sample and deletes those older than CLOCKQ_LOAD_HISTORY_DAYS. Where the
figures come from:

- the database: jobs queued (by current tier; the waiting GPU demand), running (busy GPUs, and
  per host from the worker's name `gpu<N>@<host>`) and held for admission;
- Redis: the GPU workers' heartbeats (capacity: GPU workers alive, clockq.bus.heartbeat) and the
  latest telemetry sample of each GPU (clockq.bus.gpu_samples: SM busy, and the host's CPU and
  memory, which every GPU worker's probe reads with psutil).

The load index is defined in clockq/policy/load.py. Without the broker there is no capacity and
no telemetry: no sample is recorded (a gap, not a row of zeros) and the error is raised.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from clockq.bus import gpu_samples, heartbeat
from clockq.bus.client import client
from clockq.forecasting.models import MetricSample
from clockq.jobs.models import Job, QueueTier
from clockq.policy import load
from clockq.policy.states import JobState

log = logging.getLogger("clockq.load")

WORKER_NAME = re.compile(r"gpu(\d+)@(.+)")
# A second run this soon after the last sample (a re-delivered or doubled beat tick) records
# nothing: well under the shortest interval (15 s).
MIN_GAP = timedelta(seconds=5)
# GPUs each queued job asks for. One today; a job asking for several would count that many.
GPUS_PER_JOB = 1


def record_sample(now: datetime | None = None) -> MetricSample:
    """Gather the cluster's load now and store it as the sample of this second (a sample already
    stored for the same second is replaced). Raises redis.RedisError when the broker is down."""
    now = (now or timezone.now()).replace(microsecond=0)
    workers = heartbeat.live_workers()
    samples = gpu_samples.cluster_samples(client())
    gpu_workers = {w["hostname"]: w for w in workers if w.get("gpu") is not None and w.get("hostname")}
    gpus = len(gpu_workers)
    gpus_by_host = Counter(_host_of(name, w) for name, w in gpu_workers.items())

    codes = dict(QueueTier.objects.values_list("id", "code"))
    queued = Counter(Job.objects.filter(state=JobState.QUEUED).order_by().values_list("tier_id", flat=True))
    queue_depth = {code: queued.get(tier_id, 0) for tier_id, code in sorted(codes.items(), key=lambda kv: kv[1])}
    waiting_gpus = GPUS_PER_JOB * sum(queued.values())
    held = Job.objects.filter(state=JobState.HELD, held_for_admission=True).count()

    busy_by_host: Counter[str] = Counter()
    rows = Job.objects.filter(state=JobState.RUNNING).order_by().values_list("worker").annotate(n=Count("id"))
    for worker, n in rows:
        match = WORKER_NAME.fullmatch(worker or "")
        busy_by_host[match.group(2) if match else (worker or "unknown")] += n
    running_gpus = GPUS_PER_JOB * sum(busy_by_host.values())

    readings = [load.GpuReading(s.host, s.gpu_util, s.host_cpu, s.host_mem, s.ts) for s in samples]
    hosts = load.host_loads(readings, busy_by_host, gpus_by_host)
    cluster = load.cluster_load(readings, hosts)
    sample, _ = MetricSample.objects.update_or_create(
        at=now,
        defaults=dict(
            gpu_util=_rounded(cluster.gpu_util),
            cpu=_rounded(cluster.cpu),
            memory=_rounded(cluster.memory),
            queue_depth=queue_depth,
            held=held,
            running_gpus=running_gpus,
            waiting_gpus=waiting_gpus,
            gpus=gpus,
            load_index=_rounded(load.load_index(running_gpus, waiting_gpus, gpus)),
            hosts={h.host: {k: _rounded(v) for k, v in h.as_dict().items()} for h in hosts},
        ),
    )
    return sample


def prune(keep_days: int | None = None, now: datetime | None = None) -> int:
    """Delete the samples older than `keep_days` (CLOCKQ_LOAD_HISTORY_DAYS). Returns how many."""
    days = settings.CLOCKQ_LOAD_HISTORY_DAYS if keep_days is None else keep_days
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ValueError(f"keep_days must be a whole number of at least 1, not {days!r}")
    cutoff = (now or timezone.now()) - timedelta(days=days)
    deleted, _ = MetricSample.objects.filter(at__lt=cutoff).delete()
    return deleted


def sample_load(now: datetime | None = None) -> MetricSample | None:
    """What the beat task does: record a sample (unless one was taken in the last MIN_GAP) and
    apply retention. Returns the new sample, or None when it skipped."""
    now = now or timezone.now()
    latest = MetricSample.objects.order_by("-at").values_list("at", flat=True).first()
    if latest is not None and now - MIN_GAP < latest <= now:
        log.info("load sample skipped: the last one is %.1f s old", (now - latest).total_seconds())
        return None
    sample = record_sample(now)
    if deleted := prune(now=now):
        log.info("load history: deleted %s sample(s) older than %s days", deleted, settings.CLOCKQ_LOAD_HISTORY_DAYS)
    return sample


def latest_sample() -> MetricSample | None:
    return MetricSample.objects.order_by("-at").first()


def _host_of(name: str, info: dict) -> str:
    """The host a GPU worker runs on: the host part of its name `gpu<N>@<host>` (what running
    jobs name), else the host it announced."""
    match = WORKER_NAME.fullmatch(name)
    return match.group(2) if match else str(info.get("host") or "unknown")


def _rounded(value: float | int | None) -> float | int | None:
    return round(value, 6) if isinstance(value, float) else value
