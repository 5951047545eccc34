"""A job's metric curves in the database: loaded by the worker that runs the job, saved at its
checkpointed slice boundaries (in the transaction that records the checkpoint), read by the API,
the job page and the admin."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from clockq.jobs import hot_sql
from clockq.jobs.models import JobMetric
from clockq.policy.metrics import Series


def load(job_id: int) -> dict[str, Series]:
    return {
        m.name: Series(
            points=[(int(step), float(value)) for step, value in m.points],
            stride=m.stride,
            last=(int(m.last[0]), float(m.last[1])) if m.last else None,
        )
        for m in JobMetric.objects.filter(job_id=job_id)
    }


def save(job_id: int, curves: dict[str, Series], names: Iterable[str], stored: Iterable[str] = ()) -> None:
    """Write the curves `names` of this job. Those in `stored`, which the caller loaded or saved
    before, are updated in one statement each; the others are created (or updated, if another
    claim created them meanwhile)."""
    stored = set(stored)
    for name in names:
        s = curves[name]
        fields = {"points": [list(p) for p in s.points], "stride": s.stride, "last": list(s.last) if s.last else None}
        if name in stored and hot_sql.update(JobMetric, {"job_id": job_id, "name": name}, fields):
            continue
        JobMetric.objects.update_or_create(job_id=job_id, name=name, defaults=fields)


def curves(job_id: int) -> dict[str, Any]:
    """What the API and the job page show: each metric's points (the newest included) and its
    latest value."""
    out = {}
    for m in JobMetric.objects.filter(job_id=job_id):
        points = [list(p) for p in m.points] + ([list(m.last)] if m.last else [])
        out[m.name] = {"points": points, "latest": points[-1] if points else None}
    return out


def latest(job_ids: list[int]) -> dict[int, dict[str, float]]:
    """The newest value of every metric of these jobs (for lists)."""
    found: dict[int, dict[str, float]] = {}
    for job_id, name, points, last in JobMetric.objects.filter(job_id__in=job_ids).values_list(
        "job_id", "name", "points", "last"
    ):
        newest = last or (points[-1] if points else None)
        if newest:
            found.setdefault(job_id, {})[name] = float(newest[1])
    return found
