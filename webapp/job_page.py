"""The job page, built to stay the same size however long the job ran.

A long job has thousands of slices and events. The page shows the newest `RECENT` of each and
links to a paginated listing of all of them (`?show=slices` or `?show=events`, `&page=N`), and
draws the whole run as a slice timeline of at most `TIMELINE_SPANS` spans: up to that many slices
one span each, beyond it adjacent slices merged in the database (grouped by id range, which is
start order, since a job's slices are written as they end). So the page's queries, and its
weight, do not grow with the job (tests/webapp/test_job_page.py).
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.core.exceptions import BadRequest
from django.core.paginator import Paginator
from django.db.models import Count, ExpressionWrapper, F, IntegerField, Max, Min, Q

from clockq.control_state import control
from clockq.jobs.models import Job, Slice
from clockq.policy.slicing import SliceOutcome
from webapp.dashboard_timeline import PROMOTION_PREFIXES
from webapp.serializers import admission_note

RECENT = 20  # the newest slices and events the page shows
PAGE_SIZE = 100  # rows on a page of ?show=slices or ?show=events
TIMELINE_SPANS = 300  # at most, on the slice timeline
LISTINGS = ("slices", "events")

# How a slice (or a merged span) ended, least notable first: a merged span shows the most notable
# of its slices, and says how many of each it holds.
TIMELINE_KINDS = ("continued", "completed", "yielded", "preempted", "lost", "failed")
TIMELINE_COLOURS = {
    "continued": "#0969da",
    "completed": "#1a7f37",
    "yielded": "#bf8700",
    "preempted": "#d62728",
    "lost": "#8250df",
    "failed": "#1b1f24",
}
_KIND_FILTERS = {
    "continued": Q(outcome=SliceOutcome.CONTINUED),
    "completed": Q(outcome=SliceOutcome.COMPLETED),
    "yielded": Q(outcome=SliceOutcome.YIELDED, preempted=False),
    "preempted": Q(outcome=SliceOutcome.YIELDED, preempted=True),
    "lost": Q(outcome__in=[SliceOutcome.LOST, SliceOutcome.FAULT]),
    "failed": Q(outcome=SliceOutcome.FAILED),
}


def context(job: Job, query) -> dict:
    """The template's context for `job`, given the request's query parameters. BadRequest for a
    `show` that names no listing."""
    show = query.get("show", "")
    if show and show not in LISTINGS:
        raise BadRequest(f"show must be one of {', '.join(LISTINGS)}, not {show[:20]!r}")
    slices = job.slices.order_by("-started_at", "-id")
    events = job.events.order_by("-at", "-id")
    timeline = slice_timeline(job.pk)
    return {
        "job": job,
        "show": show,
        "recent": RECENT,
        "slices": _listing(slices, query.get("page", 1) if show == "slices" else None),
        "events": _listing(events, query.get("page", 1) if show == "events" else None),
        "slice_total": timeline["slices"] if timeline else 0,
        "timeline": timeline,
        "has_metrics": job.metrics.exists(),
        "promotion_reason": promotion_reason(job),
        "admission_note": admission_note(control.admission())
        if job.held_for_admission and job.state == "held"
        else None,
        "held_release": control.held_release(job),
        "storage_fault_limit": settings.CLOCKQ_JOB_STORAGE_FAULTS,
    }


def _listing(rows, page_number: str | int | None) -> dict:
    """The newest RECENT rows and whether there are more; with a page number, that page of all."""
    if page_number is None:
        newest = list(rows[: RECENT + 1])
        return {"rows": newest[:RECENT], "more": len(newest) > RECENT, "page": None}
    page = Paginator(rows, PAGE_SIZE).get_page(page_number)
    return {"rows": page.object_list, "more": False, "page": page}


def promotion_reason(job: Job) -> str | None:
    """Why a promoted job is in a tier above its own: the newest promotion's reason, in full."""
    if job.tier_id == job.original_tier_id:
        return None
    wanted = Q()
    for prefix in PROMOTION_PREFIXES:
        wanted |= Q(reason__startswith=prefix)
    return job.events.filter(wanted).order_by("-at", "-id").values_list("reason", flat=True).first()


def slice_timeline(job_id: int, max_spans: int = TIMELINE_SPANS) -> dict | None:
    """The job's slices as at most `max_spans` spans, oldest first, for job_timeline.js; None
    before its first slice. Each span is `[start, end, kind, slices, counts]`: start and end in ms
    after `t0` (ms since the epoch), the index of its most notable kind in `kinds`, how many
    slices it merges, and how many of each kind. Two queries, whatever the number of slices."""
    slices = Slice.objects.filter(job_id=job_id)
    found = slices.aggregate(n=Count("id"), lo=Min("id"), hi=Max("id"), t0=Min("started_at"))
    if not found["n"]:
        return None
    counts = {kind: Count("id", filter=wanted) for kind, wanted in _KIND_FILTERS.items()}
    if found["n"] <= max_spans:
        rows = slices.values("id").annotate(start=Min("started_at"), end=Max("ended_at"), **counts)
        rows = rows.order_by("start", "id")
    else:
        width = -(-(found["hi"] - found["lo"] + 1) // max_spans)  # ids per span, rounded up
        # Integer division in SQL (both operands are integers, on SQLite and PostgreSQL alike).
        bucket = ExpressionWrapper((F("id") - found["lo"]) / width, output_field=IntegerField())
        rows = slices.annotate(bucket=bucket).values("bucket")
        rows = rows.annotate(start=Min("started_at"), end=Max("ended_at"), **counts).order_by("bucket")
    t0 = found["t0"]
    spans = [_span(row, t0) for row in rows]
    return {
        "t0": round(t0.timestamp() * 1000),
        "kinds": list(TIMELINE_KINDS),
        "colours": [TIMELINE_COLOURS[kind] for kind in TIMELINE_KINDS],
        "slices": found["n"],
        "merged": found["n"] > len(spans),
        "spans": spans,
    }


def _span(row: dict, t0: datetime) -> list:
    tally = [row[kind] for kind in TIMELINE_KINDS]
    notable = max((i for i, n in enumerate(tally) if n), default=0)
    start = round((row["start"] - t0).total_seconds() * 1000)
    end = max(start, round((row["end"] - t0).total_seconds() * 1000))
    return [start, end, notable, sum(tally), tally]
