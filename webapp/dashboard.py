"""The staff dashboard: /dashboard is a page of Plotly charts that polls /dashboard/data.

The window (`minutes`, the last 15 minutes unless the URL says otherwise) and the slice
timeline's (`timeline_s`) are query parameters of both the page and its data, so a link shows
what its sender saw. Within the last hour the queue depth, longest waits and load index come from
a sample every 5 s (clockq/jobs/queue_samples.py), which shows a burst that comes and goes within
a minute; longer windows use the minute series: the KPI rollup (clockq/kpis/reports.py) and the
load history. The figures' shapes are webapp/dashboard_series.py's, the slice timeline
webapp/dashboard_timeline.py's. Live figures (jobs queued and running now, the GPUs' latest
telemetry) make the page useful before the first sample. plotly.js is the plotly wheel's own
bundle, served as a static file (settings.STATICFILES_DIRS): the page needs no internet.
"""

from __future__ import annotations

from datetime import timedelta
from functools import wraps
from typing import Any

import redis
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db.models import Count, F
from django.http import HttpResponseBadRequest, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from clockq.bus import gpu_samples
from clockq.bus.client import client
from clockq.jobs.models import Job, QueueTier
from clockq.policy.kpis import WAIT_BUCKETS_MS
from clockq.policy.states import JobState
from clockq.policy.tiers import BK, BP, HP, RT, SP
from webapp.dashboard_series import fine_series, kpi_charts, load_and_control, plotly_time
from webapp.dashboard_timeline import slice_timeline

POLL_MS = 5_000
# The windows the page offers, and how the picker names them.
WINDOWS = {15: "15 min", 60: "1 h", 360: "6 h", 1440: "24 h", 10080: "7 d"}
KPI_MINUTES = tuple(WINDOWS)
TIMELINE_SECONDS = (60, 120, 300, 600)
DEFAULT_KPI_MINUTES, DEFAULT_TIMELINE_S = 15, 120

# Tier colours: urgent is warm. A tier added in the admin gets a colour from the rest.
TIER_COLOURS = {RT.code: "#d62728", HP.code: "#ff7f0e", SP.code: "#1f77b4", BP.code: "#2ca02c", BK.code: "#7f7f7f"}
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
    """The page, its pickers set from the URL's `minutes` and `timeline_s` (a shared link)."""
    minutes, timeline_s, errors = windows_of(request.GET)
    if errors:
        problems = "; ".join(f"{name} {problem}" for name, problem in errors.items())
        return HttpResponseBadRequest(f"Bad dashboard link: {problems}.", content_type="text/plain; charset=utf-8")
    return render(
        request,
        "webapp/dashboard.html",
        {
            "dashboard_config": {
                "dataUrl": reverse("dashboard-data"),
                "pollMs": POLL_MS,
                "waitBucketsMs": WAIT_BUCKETS_MS,
            },
            "windows": WINDOWS.items(),
            "timeline_seconds": TIMELINE_SECONDS,
            "minutes": minutes,
            "timeline_s": timeline_s,
        },
    )


@staff_required
def dashboard_data(request):
    minutes, timeline_s, errors = windows_of(request.GET)
    if errors:
        return JsonResponse({"detail": "bad query", "errors": errors}, status=400)
    now = timezone.now()
    since = now - timedelta(minutes=minutes)
    tiers = list(QueueTier.objects.all())
    return JsonResponse(
        {
            "now": plotly_time(now),
            "window": {"minutes": minutes, "since": plotly_time(since)},
            "tiers": tier_info(tiers),
            "live": live_state(tiers),
            "fine": fine_series(since=since, until=now, tiers=[t.code for t in tiers]),
            "kpis": kpi_charts(since=since, until=now),
            "timeline": slice_timeline(since=now - timedelta(seconds=timeline_s), until=now),
            "load": load_and_control(since=since, now=now),
        }
    )


def windows_of(query) -> tuple[int, int, dict[str, str]]:
    """The window and the timeline's window that a query asks for (the defaults where it names
    none), and what is wrong with it: field -> problem."""
    errors: dict[str, str] = {}
    minutes = _choice(query, "minutes", KPI_MINUTES, DEFAULT_KPI_MINUTES, errors)
    timeline_s = _choice(query, "timeline_s", TIMELINE_SECONDS, DEFAULT_TIMELINE_S, errors)
    return minutes, timeline_s, errors


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
