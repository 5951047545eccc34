"""The staff dashboard: /dashboard is a page of Plotly charts that polls /dashboard/data.

The per-minute charts (queue depth, waits against targets, GPU utilisation, on-time and timeout
rates) come from the KPI rollup (clockq/kpis/reports.py), so a refresh never scans every Slice.
The slice timeline wants single slices, so it reads the newest Slice rows directly, bounded by a
short window and a row cap. Live figures (jobs queued and running now, the GPUs' latest
telemetry) make the page useful before the first rollup. plotly.js is the plotly wheel's own
bundle, served as a static file (settings.STATICFILES_DIRS): the page needs no internet.
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from functools import wraps
from typing import Any

import redis
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db.models import Count, F, Q
from django.http import JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from clockq.bus import gpu_samples
from clockq.bus.client import client
from clockq.control_state import control
from clockq.control_state.models import ControlState
from clockq.forecasting import forecasts
from clockq.jobs.models import Job, JobEvent, QueueTier, Slice
from clockq.kpis import reports as kpis
from clockq.policy.kpis import WAIT_BUCKETS_MS
from clockq.policy.slicing import PREEMPTED, SliceOutcome
from clockq.policy.states import JobState

POLL_MS = 5_000
KPI_MINUTES = (15, 60, 360, 1440)  # the windows the page offers; the first of each is the default
TIMELINE_SECONDS = (60, 120, 300, 600)
DEFAULT_KPI_MINUTES, DEFAULT_TIMELINE_S = 60, 120
SLICE_CAP = 4_000  # newest slices read for the timeline
EVENT_CAP = 2_000
# The reasons the core writes on JobEvents (clockq/policy/promotion.py, clockq/policy/slicing.py,
# workers/slice_runner.py); tests/webapp/test_dashboard.py builds its fixture from the policy's
# own strings, so a reworded reason fails there.
PROMOTION_PREFIXES = ("promoted ", "batch chance")
RETURN_PREFIX = "returned to "
PREEMPTED_PREFIX = PREEMPTED  # older events say "preempted by a waiting RT job"
_RAN_IN = re.compile(r"(?:after one slice|s of service) in (\w+)")  # older events say "one slice"
# An event is written in the transaction that records its slice, a few ms either side of the
# slice's end.
_EVENT_SLACK = timedelta(seconds=2)

# Tier colours: urgent is warm. A tier added in the admin gets a colour from the rest.
TIER_COLOURS = {"RT": "#d62728", "HP": "#ff7f0e", "SP": "#1f77b4", "BP": "#2ca02c", "BK": "#7f7f7f"}
SPARE_COLOURS = ("#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


def staff_required(view):
    """Anonymous visitors go to the login page; users who are not staff get a 403."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not request.user.is_staff:
            raise PermissionDenied("The dashboard is for staff.")
        return view(request, *args, **kwargs)

    return wrapper


@staff_required
def dashboard(request):
    return render(
        request,
        "webapp/dashboard.html",
        {
            "dashboard_config": {
                "dataUrl": reverse("dashboard-data"),
                "pollMs": POLL_MS,
                "waitBucketsMs": WAIT_BUCKETS_MS,
            },
            "kpi_minutes": KPI_MINUTES,
            "timeline_seconds": TIMELINE_SECONDS,
            "default_kpi_minutes": DEFAULT_KPI_MINUTES,
            "default_timeline_s": DEFAULT_TIMELINE_S,
        },
    )


@staff_required
def dashboard_data(request):
    errors: dict[str, str] = {}
    minutes = _choice(request.GET, "minutes", KPI_MINUTES, DEFAULT_KPI_MINUTES, errors)
    timeline_s = _choice(request.GET, "timeline_s", TIMELINE_SECONDS, DEFAULT_TIMELINE_S, errors)
    if errors:
        return JsonResponse({"detail": "bad query", "errors": errors}, status=400)
    now = timezone.now()
    tiers = list(QueueTier.objects.order_by("rank"))
    return JsonResponse(
        {
            "now": _ts(now),
            "tiers": tier_info(tiers),
            "live": live_state(tiers),
            "kpis": kpi_charts(since=now - timedelta(minutes=minutes), until=now),
            "timeline": slice_timeline(since=now - timedelta(seconds=timeline_s), until=now),
            "load": load_and_control(since=now - timedelta(minutes=minutes), now=now),
        }
    )


def _choice(query, name: str, allowed: tuple[int, ...], default: int, errors: dict[str, str]) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value not in allowed:
        errors[name] = f"must be one of {', '.join(map(str, allowed))}"
        return default
    return value


def _ts(moment: datetime) -> str:
    """UTC, as plotly.js reads a date (it ignores time zones)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def tier_info(tiers: list[QueueTier]) -> list[dict[str, Any]]:
    spare = iter(SPARE_COLOURS * (1 + len(tiers) // len(SPARE_COLOURS)))
    return [
        {
            "code": t.code,
            "use": t.use,
            "rank": t.rank,
            "wait_target_ms": t.wait_target_ms,
            "colour": TIER_COLOURS.get(t.code) or next(spare),
        }
        for t in tiers
    ]


def live_state(tiers: list[QueueTier]) -> dict[str, Any]:
    """Now: jobs waiting, running and held per tier, and the latest sample of every GPU."""
    # Per the job's own tier, as the KPIs count it: a promoted SP job is still SP's to serve.
    counts = {
        (row["original_tier__code"], row["state"]): row["n"]
        for row in Job.objects.filter(state__in=[JobState.QUEUED, JobState.RUNNING, JobState.HELD])
        .values("original_tier__code", "state")
        .annotate(n=Count("id"))
    }
    promoted_waiting = Job.objects.filter(state=JobState.QUEUED).exclude(tier=F("original_tier")).count()
    try:
        samples = [
            # Named as the GPU workers name themselves (and the slice timeline's rows).
            {"worker": f"gpu{s.gpu_index}@{s.host}", "gpu": s.gpu_index, "util": s.gpu_util, "simulated": s.simulated}
            for s in gpu_samples.cluster_samples(client())
        ]
    except redis.RedisError:
        samples = None  # the broker is away; the page says so and keeps the rest
    return {
        "queued": {t.code: counts.get((t.code, JobState.QUEUED), 0) for t in tiers},
        "running": {t.code: counts.get((t.code, JobState.RUNNING), 0) for t in tiers},
        "held": {t.code: counts.get((t.code, JobState.HELD), 0) for t in tiers},
        "promoted_waiting": promoted_waiting,
        "gpus": samples,
    }


def kpi_charts(*, since: datetime, until: datetime) -> dict[str, Any] | None:
    """The rollup's figures for the window (clockq/kpis/reports.py), shaped for the charts; None
    before the first rollup."""
    window = kpis.summary(since, until)
    if window["rolled_up_until"] is None:
        return None
    over_time = kpis.series(since, until)
    tiers = {**window["tiers"], "all": window["overall"]}
    return {
        "since": _ts(over_time["since"]),
        "until": _ts(over_time["until"]),
        "rolled_up_until": _ts(window["rolled_up_until"]),
        "step_s": over_time["step_s"],
        "minutes": [_ts(t) for t in over_time["t"]],
        "queue_depth": over_time["queue_depth"],
        "gpus": [
            {"worker": worker, "gpu": gpu["gpu_index"], "busy": gpu["busy"], "util": gpu["util"]}
            for worker, gpu in over_time["gpus"].items()
        ],
        "waits": {
            code: {
                "started": kpi["started"],
                "counts": kpi["wait_histogram"]["counts"],
                "within_target": share_within(kpi["wait_histogram"]["counts"], kpi["wait_target_s"]),
                "mean_s": kpi["wait_mean_s"],
                "p95_s": kpi["wait_p95_s"],
            }
            for code, kpi in window["tiers"].items()
        },
        "rates": {
            code: {
                "judged": kpi["ended"]["succeeded"] + kpi["ended"]["failed"] + kpi["ended"]["timed_out"],
                "on_time": kpi["on_time_rate"],
                "timed_out": kpi["timeout_rate"],
            }
            for code, kpi in tiers.items()
        },
        "promotions": window["overall"]["promotions"],
        "switches": window["overall"]["switches"],
        "gpu_busy_share": window["gpus"]["busy_share"],
    }


def share_within(counts: list[int], target_s: float | None) -> float | None:
    """The share of waits in histogram `counts` that met a target. The buckets' bounds include
    every tier's target (clockq/policy/kpis.py), so this is exact for the tiers' own targets."""
    total = sum(counts)
    if not total or target_s is None:
        return None
    met = sum(n for bound, n in zip(WAIT_BUCKETS_MS, counts, strict=False) if bound <= target_s * 1000)
    return met / total


# --- load, forecasts and control ---------------------------------------------------------------


def load_and_control(*, since: datetime, now: datetime) -> dict[str, Any]:
    """The load index of the samples in the window; the forecasts made in it, each placed at the
    time it forecasts (made + horizon, so it lines up with the load it predicted); the latest
    forecast; the control state and the thresholds it acts on."""
    samples = forecasts.load_series(since, now)
    made = forecasts.forecast_series(since, now)
    latest = forecasts.latest_forecast()
    state = control.admission() if ControlState.objects.exists() else None
    t = control.thresholds()
    return {
        "samples": [{"t": _ts(s["at"]), "load": s["load_index"], "gpu_util": s["gpu_util"]} for s in samples],
        "forecasts": [
            {
                "made": _ts(f["at"]),
                "t": _ts(f["at"] + timedelta(seconds=f["horizon_s"])),
                "value": f["value"],
                "model": f["model"],
            }
            for f in made
        ],
        "latest": None
        if latest is None
        else {
            "made": _ts(latest.at),
            "t": _ts(latest.at + timedelta(seconds=latest.horizon_s)),
            "value": latest.value,
            "model": latest.model,
            "reason": latest.reason,
            "age_s": round((now - latest.at).total_seconds(), 1),
            "stale": (now - latest.at).total_seconds() > forecasts.STALE_AFTER_S,
        },
        "control": None
        if state is None
        else {
            "admission_open": state.admission_open,
            "prefetch_on": state.prefetch_on,
            "desired_workers": state.desired_workers,
            "reason": state.reason,
            "forecast": state.forecast,
            "forecast_at": _ts(state.forecast_at) if state.forecast_at else None,
            "forced": state.forced,
            "forced_by": state.forced_by,
        },
        "thresholds": {
            "close_above": t.close_above,
            "reopen_below": t.reopen_below,
            "scale_out_above": t.scale_out_above,
            "prefetch_below": t.prefetch_below,
        },
        "horizon_s": forecasts.HORIZON_S,
    }


# --- the slice timeline ------------------------------------------------------------------------


def slice_timeline(*, since: datetime, until: datetime, cap: int = SLICE_CAP) -> dict[str, Any]:
    """Recent slices per GPU worker as Gantt bars, with switches, preemptions and promotions.

    A run of slices in which a job kept its GPU (outcome `continued`) is one bar: nothing was
    switched there. A bar after which the GPU went to another job is a switch; a bar whose job
    made way for a waiting RT job before its time was up is a preemption; a bar that ran one
    slice in a higher tier is a promoted slice. Promotions and batch chances, which happen while
    a job waits, are markers at their time.
    """
    rows = list(
        Slice.objects.filter(ended_at__gte=since, started_at__lte=until)
        .order_by("-ended_at", "-id")
        .values(
            "id",
            "job_id",
            "worker",
            "gpu_index",
            "started_at",
            "ended_at",
            "outcome",
            "plan_reason",
            "job__name",
            "job__original_tier__code",
        )[:cap]
    )
    truncated = len(rows) == cap
    rows.reverse()
    running = list(
        Job.objects.filter(state=JobState.RUNNING, slice_started_at__isnull=False).values(
            "id", "name", "worker", "slice_started_at", "tier__code", "original_tier__code"
        )
    )
    # Promoted, waiting for its slice in the higher tier: its promotion is a marker already.
    promoted_waiting = (
        Job.objects.filter(state=JobState.QUEUED).exclude(tier=F("original_tier")).values_list("id", flat=True)
    )
    job_ids = {r["job_id"] for r in rows} | {j["id"] for j in running} | set(promoted_waiting)
    events = _events(job_ids, since - _EVENT_SLACK)

    ran_in, preempted = _slices_marked_by(rows, events)
    bars = _bars(rows, ran_in, preempted)
    gpu_of = {r["worker"]: r["gpu_index"] for r in rows}
    bars += [_running_bar(job, gpu_of.get(job["worker"]), since=since, until=until) for job in running]
    workers = sorted({b["worker"] for b in bars}, key=lambda w: (gpu_of.get(w) is None, w))
    return {
        "since": _ts(since),
        "until": _ts(until),
        "workers": [{"worker": w, "gpu": gpu_of.get(w)} for w in workers],
        "bars": bars,
        "switches": _switches(bars),
        "promotions": [
            {
                "at": _ts(e["at"]),
                "job": e["job_id"],
                "name": e["job__name"],
                "tier": e["job__original_tier__code"],
                "reason": e["reason"],
                "actor": e["actor"],
            }
            for e in events
            if e["reason"].startswith(PROMOTION_PREFIXES) and since <= e["at"] <= until
        ],
        "truncated": truncated,
    }


def _running_bar(job: dict[str, Any], gpu: int | None, *, since: datetime, until: datetime) -> dict[str, Any]:
    """A slice still running: a bar from its start (or `since`) to `until`."""
    start = max(job["slice_started_at"], since)
    return {
        "worker": job["worker"],
        "gpu": gpu,
        "job": job["id"],
        "name": job["name"],
        "tier": job["original_tier__code"],
        "ran_in": job["tier__code"],
        "start": _ts(start),
        "end": _ts(until),
        "ms": max(0, round((until - start).total_seconds() * 1000)),
        "slices": 1,
        "outcome": "running",
        "preempted": False,
        "promoted": job["tier__code"] != job["original_tier__code"],
    }


def _events(job_ids: set[int], since: datetime) -> list[dict[str, Any]]:
    """The promotions, returns and preemptions of these jobs since then, oldest first."""
    if not job_ids:
        return []
    wanted = Q()
    for prefix in (*PROMOTION_PREFIXES, RETURN_PREFIX, PREEMPTED_PREFIX):
        wanted |= Q(reason__startswith=prefix)
    events = list(
        JobEvent.objects.filter(wanted, job_id__in=job_ids, at__gte=since)
        .order_by("-at", "-id")
        .values("job_id", "at", "reason", "actor", "job__name", "job__original_tier__code")[:EVENT_CAP]
    )
    events.reverse()
    return events


def _slices_marked_by(rows, events) -> tuple[dict[int, str], set[int]]:
    """Which slices ran promoted (slice id -> the tier it ran in) and which were preempted (made
    way for an urgent job before their planned end): each return or preemption event belongs to
    its job's slice that ended nearest to it."""
    by_job: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        by_job[r["job_id"]].append(r)
    ran_in: dict[int, str] = {}
    preempted: set[int] = set()
    for e in events:
        is_return = e["reason"].startswith(RETURN_PREFIX)
        if not (is_return or e["reason"].startswith(PREEMPTED_PREFIX)):
            continue
        near = [r for r in by_job.get(e["job_id"], ()) if abs(r["ended_at"] - e["at"]) <= _EVENT_SLACK]
        if not near:
            continue
        nearest = min(near, key=lambda r: abs(r["ended_at"] - e["at"]))
        if is_return:
            found = _RAN_IN.search(e["reason"])
            ran_in[nearest["id"]] = found.group(1) if found else ""
        else:
            preempted.add(nearest["id"])
    return ran_in, preempted


def _bars(rows, ran_in: dict[int, str], preempted: set[int]) -> list[dict[str, Any]]:
    bars: list[dict[str, Any]] = []
    open_bar: dict[str, dict[str, Any]] = {}  # worker -> its latest bar
    for r in rows:
        previous = open_bar.get(r["worker"])
        if (
            previous is not None
            and previous["job"] == r["job_id"]
            and previous["outcome"] == SliceOutcome.CONTINUED
            and r["id"] not in ran_in
        ):
            bar = previous
            bar["slices"] += 1
        else:
            bar = {
                "worker": r["worker"],
                "gpu": r["gpu_index"],
                "job": r["job_id"],
                "name": r["job__name"],
                "tier": r["job__original_tier__code"],
                "ran_in": ran_in.get(r["id"]) or r["job__original_tier__code"],
                "start_at": r["started_at"],
                "slices": 1,
                "promoted": r["id"] in ran_in,
            }
            bars.append(bar)
            open_bar[r["worker"]] = bar
        bar["end_at"] = r["ended_at"]
        bar["outcome"] = r["outcome"]
        bar["preempted"] = r["id"] in preempted
    for bar in bars:
        start, end = bar.pop("start_at"), bar.pop("end_at")
        bar.update(start=_ts(start), end=_ts(end), ms=max(0, round((end - start).total_seconds() * 1000)))
    return bars


def _switches(bars: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where a GPU went from one job to another."""
    switches = []
    last: dict[str, dict[str, Any]] = {}
    for bar in sorted(bars, key=lambda b: (b["worker"], b["start"])):
        before = last.get(bar["worker"])
        if before is not None and before["job"] != bar["job"]:
            switches.append(
                {
                    "worker": bar["worker"],
                    "at": bar["start"],
                    "from_job": before["job"],
                    "to_job": bar["job"],
                    "after": before["outcome"],
                }
            )
        last[bar["worker"]] = bar
    return switches
