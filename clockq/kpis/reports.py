"""KPIs over a time window, read from the rollup tables (clockq/kpis/rollup.py), never from
every Slice. /api/kpis serves summary(); the dashboard draws series().

Windows are whole minutes: `since` is rounded down and `until` up to a minute, and the answer
says which window it covers and how far the rollup had come (`rolled_up_until`); the minutes
after that are not in yet. The arithmetic is clockq/policy/kpis.py.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Max, Sum

from clockq.jobs.models import QueueTier
from clockq.kpis.models import GpuHour, GpuMinute, KpiHour, KpiMinute
from clockq.kpis.rollup import HOUR, MINUTE, SUMS, floor_hour, rollup, totals_of
from clockq.policy.kpis import MINUTE_MS, Totals, ceil_minute, floor_minute, ratio, report

__all__ = ["rollup", "series", "summary"]

# series() answers at most this many points; a longer window is added up in steps of minutes.
MAX_POINTS = 1440


def aligned(since: datetime, until: datetime) -> tuple[datetime, datetime]:
    """The window of whole minutes that covers [since, until)."""
    return floor_minute(since), ceil_minute(until)


def summary(since: datetime, until: datetime) -> dict[str, Any]:
    """The KPIs of [since, until), per tier (the job's own tier) and overall:

    - started, wait_mean_s (exact: sum / count), wait_p95_s (from the histogram, interpolated
      within its bucket), wait_target_s, wait_histogram {bounds_ms, counts};
    - ended {succeeded, failed, timed_out, cancelled}: jobs that ended in the window;
    - timeout_rate = timed_out / (succeeded + failed + timed_out); on_time_rate = on_time / the
      same (cancelled jobs count in neither); on_time, late (jobs marked late in the window);
    - promotions (promotions and batch chances), slices, slice_outcomes, switches,
      switch_mean_ms (checkpoint + restore per yielded slice);
    - gpu_busy_share = slice GPU time / capacity, gpu_util_mean = NVML utilisation x slice time
      / capacity, busy_gpu_hours, useful_gpu_hours (completed, yielded and continued slices'
      work time), cost_per_useful_gpu_hour = price x capacity GPU-hours / useful GPU-hours (a
      tier is charged the capacity in proportion to its busy time);
    where capacity is 60 s for each GPU worker alive in each minute. Rates are None (JSON null)
    when their denominator is 0."""
    since, until = aligned(since, until)
    tiers = list(QueueTier.objects.values_list("id", "code", "wait_target_ms"))
    totals = {tier_id: Totals() for tier_id, _, _ in tiers}
    workers: set[str] = set()
    gpu_minutes, busy_ms, util_ms = 0, 0.0, 0.0
    for model, field, start, end in periods(since, until):
        window = {f"{field}__gte": start, f"{field}__lt": end}
        for row in model.objects.filter(**window).values("tier_id").annotate(**SUMS):
            totals.setdefault(row["tier_id"], Totals()).add(totals_of(row))
        gpu_model = GpuHour if model is KpiHour else GpuMinute
        minutes = Sum("minutes") if model is KpiHour else Count("id")
        per_worker = gpu_model.objects.filter(**window).values("worker")
        for row in per_worker.annotate(minutes=minutes, busy=Sum("busy_ms"), util=Sum("util_ms")):
            workers.add(row["worker"])
            gpu_minutes += row["minutes"] or 0
            busy_ms += row["busy"] or 0
            util_ms += row["util"] or 0.0
    capacity_ms = gpu_minutes * MINUTE_MS
    overall = Totals()
    for t in totals.values():
        overall.add(t)
    price = settings.CLOCKQ_GPU_HOUR_PRICE

    def kpis(t: Totals, target_ms: int | None = None) -> dict[str, Any]:
        return report(t, capacity_ms=capacity_ms, all_busy_ms=overall.busy_ms, price=price, wait_target_ms=target_ms)

    return {
        "since": since,
        "until": until,
        "minutes": (until - since) // MINUTE,
        "rolled_up_until": _rolled_up_until(),
        "gpu_hour_price": price,
        "gpus": {
            "workers": len(workers),
            "capacity_gpu_hours": capacity_ms / 3_600_000,
            "busy_share": ratio(busy_ms, capacity_ms),
            "util_mean": ratio(util_ms, capacity_ms),
        },
        "tiers": {code: kpis(totals[tier_id], target) for tier_id, code, target in tiers},
        "overall": kpis(overall),
    }


def periods(since: datetime, until: datetime) -> list[tuple[Any, str, datetime, datetime]]:
    """Where the window's facts are: its whole hours in KpiHour, the minutes before the first and
    after the last whole hour in KpiMinute. Both hold the same sums (an hour's row is its
    minutes' total), so a month reads some 3,600 rows instead of 216,000."""
    first_hour = since if since == floor_hour(since) else floor_hour(since) + HOUR
    last_hour = floor_hour(until)
    if first_hour >= last_hour:
        return [(KpiMinute, "minute", since, until)]
    parts = [(KpiMinute, "minute", since, first_hour), (KpiHour, "hour", first_hour, last_hour)]
    parts.append((KpiMinute, "minute", last_hour, until))
    return [p for p in parts if p[2] < p[3]]


def series(since: datetime, until: datetime, step_minutes: int | None = None) -> dict[str, Any]:
    """The KPIs over time, for charts. Names are stable:

    - `t`: the start of each step (datetimes, UTC); `step_s`: its length (60 s, or more so that
      there are at most MAX_POINTS steps); `since`, `until`: the aligned window.
    - `tiers`: tier codes, most urgent first. Per tier code, one value per step:
      `queue_depth` (the deepest sample in the step; None where no minute was sampled),
      `started` (first starts), `timed_out` and `on_time` (jobs that ended so), `late`.
    - `gpus`: per GPU worker hostname, {`gpu_index`, `busy`, `util`}: busy and util are shares
      of the step's capacity (0-1), None where the worker was not alive in the step.
    """
    since, until = aligned(since, until)
    minutes = (until - since) // MINUTE
    step = max(step_minutes or math.ceil(minutes / MAX_POINTS), 1)
    points = max(math.ceil(minutes / step), 0)
    window = {"minute__gte": since, "minute__lt": until}

    def index(minute: datetime) -> int:
        return (minute - since) // MINUTE // step

    tiers = list(QueueTier.objects.values_list("id", "code"))
    per_tier = {name: {code: [0] * points for _, code in tiers} for name in ("started", "timed_out", "on_time", "late")}
    depth: dict[str, list[int | None]] = {code: [None] * points for _, code in tiers}
    code_of = dict(tiers)
    fields = ("minute", "tier_id", "queue_depth", "started", "timed_out", "on_time", "late")
    for minute, tier_id, queue_depth, *counts in KpiMinute.objects.filter(**window).values_list(*fields):
        i, code = index(minute), code_of.get(tier_id)
        if code is None:
            continue
        depth[code][i] = max(depth[code][i] or 0, queue_depth)
        for name, n in zip(("started", "timed_out", "on_time", "late"), counts, strict=True):
            per_tier[name][code][i] += n

    alive: defaultdict[str, list[int]] = defaultdict(lambda: [0] * points)
    busy: defaultdict[str, list[float]] = defaultdict(lambda: [0.0] * points)
    util: defaultdict[str, list[float]] = defaultdict(lambda: [0.0] * points)
    gpu_index: dict[str, int] = {}
    gpu_fields = ("minute", "worker", "gpu_index", "busy_ms", "util_ms")
    for minute, worker, gpu, busy_ms, util_ms in GpuMinute.objects.filter(**window).values_list(*gpu_fields):
        i = index(minute)
        gpu_index[worker] = gpu
        alive[worker][i] += 1
        busy[worker][i] += busy_ms
        util[worker][i] += util_ms

    def shares(worker: str, used: list[float]) -> list[float | None]:
        return [ratio(ms, n * MINUTE_MS) for ms, n in zip(used, alive[worker], strict=True)]

    return {
        "since": since,
        "until": until,
        "step_s": step * 60,
        "t": [since + timedelta(minutes=i * step) for i in range(points)],
        "tiers": [code for _, code in tiers],
        "queue_depth": depth,
        **per_tier,
        "gpus": {
            worker: {
                "gpu_index": gpu_index[worker],
                "busy": shares(worker, busy[worker]),
                "util": shares(worker, util[worker]),
            }
            for worker in sorted(gpu_index)
        },
    }


def _rolled_up_until() -> datetime | None:
    last = KpiMinute.objects.aggregate(last=Max("minute"))["last"]
    return None if last is None else last + MINUTE
