"""The KPI rollup: adds up jobs, slices and events per minute into KpiMinute (per tier) and
GpuMinute (per GPU worker), and each hour's sum of those into KpiHour and GpuHour, so that
/api/kpis and the dashboard read a few thousand small rows instead of every Slice. The first
run backfills the history that retention keeps, an hour of it per transaction and at most
BUDGET_S per run.

Each run recomputes, from the source rows, every complete minute since the last one it wrote,
and the TRAILING_MINUTES before it as well: the reaper writes a lost slice up to ~40 s after the
slice ended, and workers on other hosts stamp times with their own clocks. A minute's row is
replaced, not incremented, so a run is idempotent and two runs give the same rows.

Where a fact lands:
- a job's first start (and its wait from submission) in the minute of `first_started_at`;
- a job's end (and whether it was on time) in the minute of `finished_at`;
- a late mark in the minute of `late_at`, a promotion or batch chance at its JobEvent;
- a slice's count, outcome and switch in the minute it ended; its GPU time is spread over the
  minutes it ran (a slice running more than TRAILING_MINUTES loses the part before that).
Every fact counts for the job's own tier (`original_tier`), promoted or not.

GPU capacity cannot be recomputed: which workers were alive is only known at the time. Each run
gives every live GPU worker a GpuMinute row for the minutes completed since the previous run (at
most TRAILING_MINUTES back); a recomputed minute keeps its rows. History that was backfilled
only has rows for the GPUs that ran slices, so its idle capacity is unknown.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import BigIntegerField, Count, Max, Min, Q, Sum
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.utils import timezone

from clockq.bus import heartbeat
from clockq.jobs.models import Job, JobEvent, QueueTier, Slice
from clockq.kpis.models import GpuHour, GpuMinute, KpiHour, KpiMinute
from clockq.policy.kpis import WAIT_BUCKETS_MS, Totals, floor_minute, minute_shares, wait_bucket
from clockq.policy.service_levels import finished_on_time
from clockq.policy.slicing import SliceOutcome
from clockq.policy.states import TERMINAL_STATES, JobState

log = logging.getLogger("clockq.kpis")

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
TRAILING_MINUTES = 5
# The first run backfills the history that retention keeps, this much per transaction, for at
# most BUDGET_S a run.
CHUNK = timedelta(hours=1)
BUDGET_S = 10.0
# A slice is read by its end; one ending this long after a chunk may still have run inside it.
# Slices are seconds long (CLOCKQ_MAX_SLICE_MS); a longer one loses its early part in the split.
LONGEST_SLICE = timedelta(minutes=10)
# Work from these outcomes is kept; failed, lost and fault slices are rolled back.
USEFUL_OUTCOMES = frozenset({SliceOutcome.COMPLETED, SliceOutcome.YIELDED, SliceOutcome.CONTINUED})
PROMOTION_REASONS = Q(reason__startswith="promoted ") | Q(reason__startswith="batch chance")


@dataclass
class GpuTotals:
    gpu_index: int
    busy_ms: float = 0.0
    util_ms: float = 0.0
    slices: int = 0


def rollup(now: datetime | None = None, budget_s: float = BUDGET_S) -> int:
    """Roll up every complete minute not yet rolled up, and recompute the trailing ones; sample
    the queues; apply retention. Returns how many KpiMinute and GpuMinute rows were written.

    A backfill stops after `budget_s` and goes on at the next run (the control worker runs one
    task at a time, and the reaper and the SLO check must not wait behind a day of history).
    Only a finished run samples the queues: that sample's row is what marks the rollup done up
    to the last complete minute; until then the newest row written marks how far it came."""
    now = now or timezone.now()
    end = floor_minute(now)
    last = KpiMinute.objects.aggregate(last=Max("minute"))["last"]
    if last is None:
        first = Job.objects.aggregate(first=Min("submitted_at"))["first"]
        kept_from = floor_minute(now - timedelta(days=settings.CLOCKQ_KPI_RETENTION_DAYS))
        start = max(floor_minute(first), kept_from) if first else end - MINUTE
        new_from = end - MINUTE  # nothing tells which GPUs were alive before this run
    else:
        new_from = max(last + MINUTE, end - TRAILING_MINUTES * MINUTE)
        start = min(last + MINUTE, end) - TRAILING_MINUTES * MINUTE
    live = _live_gpu_workers()
    written = 0
    deadline = time.monotonic() + budget_s
    while start < end:
        stop = min(start + CHUNK, end)
        written += _roll(start, stop, live, _minutes(max(start, new_from), stop) if live else [])
        start = stop
        if start < end and time.monotonic() > deadline:
            log.info("KPI rollup: rolled up to %s; the next run goes on from there", start)
            return written
    _sample_queue_depth(end - MINUTE)
    _apply_retention(now)
    return written


def _roll(start: datetime, end: datetime, live: dict[str, int], capacity: list[datetime]) -> int:
    """Recompute the minutes [start, end). Reads first, then one short write transaction (under
    SQLite's IMMEDIATE mode a transaction holds the write lock from its first statement)."""
    targets = dict(QueueTier.objects.values_list("id", "wait_target_ms"))
    per_tier: defaultdict[tuple[datetime, int], Totals] = defaultdict(Totals)
    per_gpu: dict[tuple[datetime, str], GpuTotals] = {}
    _add_first_starts(per_tier, start, end)
    _add_ends(per_tier, start, end, targets)
    _add_late_marks(per_tier, start, end)
    _add_promotions(per_tier, start, end)
    _add_slices(per_tier, per_gpu, start, end)
    for minute in capacity:
        for worker, gpu_index in live.items():
            per_gpu.setdefault((minute, worker), GpuTotals(gpu_index))
    try:
        with transaction.atomic():
            written = _replace_minutes(start, end, per_tier, per_gpu)
            _replace_hours(start, end)
            return written
    except IntegrityError:
        # Another rollup replaced these minutes at the same moment, from the same rows.
        log.info("KPI rollup: minutes %s..%s were written by another run", start, end)
        return 0


def _add_first_starts(per_tier, start: datetime, end: datetime) -> None:
    rows = Job.objects.filter(first_started_at__gte=start, first_started_at__lt=end, first_wait_ms__isnull=False)
    rows = rows.order_by()  # no sort: the models' default orderings cost a sort per query
    for at, tier_id, wait_ms in rows.values_list("first_started_at", "original_tier_id", "first_wait_ms"):
        totals = per_tier[floor_minute(at), tier_id]
        totals.started += 1
        totals.wait_ms_sum += wait_ms
        totals.wait_counts[wait_bucket(wait_ms)] += 1


def _add_ends(per_tier, start: datetime, end: datetime, targets: dict[int, int | None]) -> None:
    rows = Job.objects.filter(finished_at__gte=start, finished_at__lt=end, state__in=TERMINAL_STATES).order_by()
    fields = ("finished_at", "original_tier_id", "state", "deadline", "first_wait_ms")
    for at, tier_id, state, deadline, first_wait_ms in rows.values_list(*fields):
        totals = per_tier[floor_minute(at), tier_id]
        setattr(totals, state, getattr(totals, state) + 1)
        totals.on_time += finished_on_time(
            succeeded=state == JobState.SUCCEEDED,
            finished_at=at,
            deadline=deadline,
            first_wait_ms=first_wait_ms,
            target_ms=targets.get(tier_id),
        )


def _add_late_marks(per_tier, start: datetime, end: datetime) -> None:
    rows = Job.objects.filter(late_at__gte=start, late_at__lt=end).order_by()
    for at, tier_id in rows.values_list("late_at", "original_tier_id"):
        per_tier[floor_minute(at), tier_id].late += 1


def _add_promotions(per_tier, start: datetime, end: datetime) -> None:
    rows = JobEvent.objects.filter(PROMOTION_REASONS, at__gte=start, at__lt=end).order_by()
    for at, tier_id in rows.values_list("at", "job__original_tier_id"):
        per_tier[floor_minute(at), tier_id].promotions += 1


def _add_slices(per_tier, per_gpu, start: datetime, end: datetime) -> None:
    """Every slice that ran during [start, end): its GPU time, split over the minutes it ran;
    its count, outcome and switch in the minute it ended, if that is inside."""
    # By end only, the index that bounds the rows: `started_at < end` as well let PostgreSQL AND
    # in the started_at index over every slice (38 of 48 ms). A slice that started after the
    # chunk adds nothing below.
    rows = Slice.objects.filter(ended_at__gte=start, ended_at__lt=end + LONGEST_SLICE).order_by()
    fields = (
        "started_at",
        "ended_at",
        "used_ms",
        "gpu_util",
        "outcome",
        "checkpoint_ms",
        "restore_ms",
        "worker",
        "gpu_index",
        "job__original_tier_id",
    )
    for row in rows.values_list(*fields, named=True):  # an hour of 8 busy GPUs: some 40,000 rows
        _add_slice(per_tier, per_gpu, start, end, row)


def _add_slice(per_tier, per_gpu, start: datetime, end: datetime, row) -> None:
    tier_id, worker, used_ms = row.job__original_tier_id, row.worker, row.used_ms
    wall_ms = max((row.ended_at - row.started_at) / timedelta(milliseconds=1), 0.0)
    useful = row.outcome in USEFUL_OUTCOMES
    for minute, ms in minute_shares(row.started_at, row.ended_at):
        if not start <= minute < end:
            continue
        part = ms / wall_ms if wall_ms else 1.0
        util_ms = used_ms * (row.gpu_util or 0.0) * part
        totals = per_tier[minute, tier_id]
        totals.busy_ms += ms
        totals.useful_ms += used_ms * part if useful else 0.0
        totals.util_ms += util_ms
        gpu_totals = per_gpu.setdefault((minute, worker), GpuTotals(row.gpu_index))
        gpu_totals.busy_ms += ms
        gpu_totals.util_ms += util_ms
    ended_minute = floor_minute(row.ended_at)
    if not start <= ended_minute < end:
        return
    totals = per_tier[ended_minute, tier_id]
    totals.slices += 1
    totals.slice_outcomes[row.outcome] = totals.slice_outcomes.get(row.outcome, 0) + 1
    per_gpu.setdefault((ended_minute, worker), GpuTotals(row.gpu_index)).slices += 1
    if row.outcome == SliceOutcome.YIELDED:
        # What the planner charges a switch: this checkpoint, plus the restore its run began
        # with (0 after a warm resume or a continued slice).
        totals.switches += 1
        totals.switch_ms_sum += row.checkpoint_ms + row.restore_ms


def _replace_minutes(start: datetime, end: datetime, per_tier, per_gpu) -> int:
    """Replace the rows of [start, end). A row that is there already stays (with zeros, if its
    facts are gone): it carries a queue-depth sample or a live GPU, which no source row holds."""
    in_window = {"minute__gte": start, "minute__lt": end}
    depth = {
        (m, t): d for m, t, d in KpiMinute.objects.filter(**in_window).values_list("minute", "tier_id", "queue_depth")
    }
    gpus = {(m, w): g for m, w, g in GpuMinute.objects.filter(**in_window).values_list("minute", "worker", "gpu_index")}
    for key in depth:
        per_tier.setdefault(key, Totals())
    for key, gpu_index in gpus.items():
        per_gpu.setdefault(key, GpuTotals(gpu_index))
    KpiMinute.objects.filter(**in_window).delete()
    GpuMinute.objects.filter(**in_window).delete()
    KpiMinute.objects.bulk_create(
        (
            _kpi_row(KpiMinute(minute=minute), tier_id, totals, depth.get((minute, tier_id), 0))
            for (minute, tier_id), totals in per_tier.items()
        ),
        batch_size=500,
    )
    GpuMinute.objects.bulk_create(
        (
            GpuMinute(
                minute=minute,
                worker=worker,
                gpu_index=t.gpu_index,
                busy_ms=round(t.busy_ms),
                util_ms=t.util_ms,
                slices=t.slices,
            )
            for (minute, worker), t in per_gpu.items()
        ),
        batch_size=500,
    )
    return len(per_tier) + len(per_gpu)


def _replace_hours(start: datetime, end: datetime) -> None:
    """Rewrite the KpiHour and GpuHour rows of every hour that [start, end) touches, from that
    hour's minute rows: the same sums, read by long windows."""
    hour = floor_hour(start)
    while hour < end:
        window = {"minute__gte": hour, "minute__lt": hour + HOUR}
        tiers = KpiMinute.objects.filter(**window).values("tier_id").annotate(**SUMS, depth=Max("queue_depth"))
        gpus = (
            GpuMinute.objects.filter(**window)
            .values("worker")
            .annotate(
                gpu_index=Max("gpu_index"),
                minutes=Count("id"),
                busy=Sum("busy_ms"),
                util=Sum("util_ms"),
                n=Sum("slices"),
            )
        )
        KpiHour.objects.filter(hour=hour).delete()
        GpuHour.objects.filter(hour=hour).delete()
        KpiHour.objects.bulk_create(
            _kpi_row(KpiHour(hour=hour), row["tier_id"], totals_of(row), row["depth"] or 0) for row in tiers
        )
        GpuHour.objects.bulk_create(
            GpuHour(
                hour=hour,
                worker=g["worker"],
                gpu_index=g["gpu_index"],
                minutes=g["minutes"],
                busy_ms=g["busy"] or 0,
                util_ms=g["util"] or 0.0,
                slices=g["n"] or 0,
            )
            for g in gpus
        )
        hour += HOUR


def floor_hour(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


def _json_sum(field: str, key: str) -> Sum:
    """SUM of one element of a JSON column (a list index or an object key), in the database: a
    day is some 7,000 rows, and decoding their JSON in Python took longer than the query."""
    return Sum(Cast(KeyTextTransform(key, field), BigIntegerField()))


_SUMMED = (
    "started",
    "wait_ms_sum",
    "succeeded",
    "failed",
    "timed_out",
    "cancelled",
    "on_time",
    "late",
    "promotions",
    "slices",
    "busy_ms",
    "useful_ms",
    "util_ms",
    "switches",
    "switch_ms_sum",
)
# What summary() and the hourly rows add up: every additive column of KpiFacts.
SUMS = {
    **{name: Sum(name) for name in _SUMMED},
    **{f"wait_{i}": _json_sum("wait_counts", str(i)) for i in range(len(WAIT_BUCKETS_MS) + 1)},
    **{f"outcome_{o.value}": _json_sum("slice_outcomes", o.value) for o in SliceOutcome},
}


def totals_of(sums: dict) -> Totals:
    """Totals from a row of SUMS (None over no rows; PostgreSQL sums integers as numeric)."""
    totals = Totals()
    for name in _SUMMED:
        kind = float if name in ("util_ms", "switch_ms_sum") else int
        setattr(totals, name, kind(sums[name] or 0))
    totals.wait_counts = [int(sums[f"wait_{i}"] or 0) for i in range(len(WAIT_BUCKETS_MS) + 1)]
    totals.slice_outcomes = {o.value: int(n) for o in SliceOutcome if (n := sums[f"outcome_{o.value}"])}
    return totals


def _kpi_row(row: KpiMinute | KpiHour, tier_id: int, t: Totals, queue_depth: int) -> KpiMinute | KpiHour:
    """`row` (a new KpiMinute or KpiHour, its period set) filled with `t`."""
    row.tier_id, row.queue_depth = tier_id, queue_depth
    for name in _SUMMED:
        setattr(row, name, getattr(t, name))
    row.busy_ms, row.useful_ms = round(t.busy_ms), round(t.useful_ms)
    row.wait_counts, row.slice_outcomes = t.wait_counts, t.slice_outcomes
    return row


def _sample_queue_depth(minute: datetime) -> None:
    """Jobs waiting now, per own tier, as the depth at the end of the minute just completed. It
    also gives every tier a row for that minute, which marks how far the rollup has come."""
    # Counted here, not with GROUP BY: SQLite then walks the tier index over every job instead of
    # the state index over the waiting ones, which are few.
    waiting = Counter(Job.objects.filter(state=JobState.QUEUED).order_by().values_list("original_tier_id", flat=True))
    for tier_id in QueueTier.objects.values_list("id", flat=True):
        depth = waiting.get(tier_id, 0)
        if not KpiMinute.objects.filter(minute=minute, tier_id=tier_id).update(queue_depth=depth):
            try:
                with transaction.atomic():
                    KpiMinute.objects.create(minute=minute, tier_id=tier_id, queue_depth=depth)
            except IntegrityError:  # another run made it meanwhile
                KpiMinute.objects.filter(minute=minute, tier_id=tier_id).update(queue_depth=depth)
    with transaction.atomic():
        _replace_hours(minute, minute + MINUTE)  # the hour's deepest sample may be this one


def _live_gpu_workers() -> dict[str, int]:
    """Hostname -> GPU index of the GPU workers alive now (the control worker has no GPU)."""
    try:
        workers = heartbeat.live_workers()
    except Exception as exc:  # the broker is down: this run records no capacity
        log.warning("KPI rollup: cannot read live workers (%s); no GPU capacity recorded this minute", exc)
        return {}
    return {w["hostname"]: w["gpu"] for w in workers if w.get("gpu") is not None and w.get("hostname")}


def _apply_retention(now: datetime) -> None:
    cutoff = now - timedelta(days=settings.CLOCKQ_KPI_RETENTION_DAYS)
    KpiMinute.objects.filter(minute__lt=cutoff).delete()
    GpuMinute.objects.filter(minute__lt=cutoff).delete()
    KpiHour.objects.filter(hour__lt=cutoff).delete()
    GpuHour.objects.filter(hour__lt=cutoff).delete()


def _minutes(start: datetime, end: datetime) -> list[datetime]:
    out = []
    while start < end:
        out.append(start)
        start += MINUTE
    return out
