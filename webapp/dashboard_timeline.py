"""The dashboard's slice timeline: recent slices per GPU worker as Gantt bars, with switches,
preemptions and promotions. It wants single slices, so it reads the newest Slice rows directly,
bounded by a short window (the page's "Timeline over") and a row cap."""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F, Q

from clockq.jobs.models import Job, JobEvent, Slice
from clockq.policy.slicing import PREEMPTED, SliceOutcome
from clockq.policy.states import JobState
from webapp.dashboard_series import plotly_time

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
        "since": plotly_time(since),
        "until": plotly_time(until),
        "workers": [{"worker": w, "gpu": gpu_of.get(w)} for w in workers],
        "bars": bars,
        "switches": _switches(bars),
        "promotions": [
            {
                "at": plotly_time(e["at"]),
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
        "start": plotly_time(start),
        "end": plotly_time(until),
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
        bar.update(
            start=plotly_time(start), end=plotly_time(end), ms=max(0, round((end - start).total_seconds() * 1000))
        )
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
