"""A job's metric curves in the database: loaded by the worker that runs the job, saved at its
checkpointed slice boundaries (in the transaction that records the checkpoint), read by the API,
the job page and the admin."""

from __future__ import annotations

import json
from collections import OrderedDict
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
        last = list(s.last) if s.last else None
        if name in stored:
            points = hot_sql.JsonText(_points_text.of(job_id, name, s.points))
            if hot_sql.update(
                JobMetric, {"job_id": job_id, "name": name}, {"points": points, "stride": s.stride, "last": last}
            ):
                continue
        fields = {"points": [list(p) for p in s.points], "stride": s.stride, "last": last}
        JobMetric.objects.update_or_create(job_id=job_id, name=name, defaults=fields)


class PointsText:
    """The JSON text of curves' points, extended as points are appended instead of encoded whole
    at every save: a curve at its 1,000 points took 1.1 ms to encode, at every slice switch of a
    job, for each of its curves. A text is valid while the Series still holds the same list: it
    only appends to it, and replaces it when it thins or forgets points. Bounded: the curves this
    process saved last."""

    def __init__(self, max_curves: int = 64):
        self.max_curves = max_curves
        self._texts: OrderedDict[tuple[int, str], tuple[list, int, str]] = OrderedDict()

    def of(self, job_id: int, name: str, points: list[tuple[int, float]]) -> str:
        key = (job_id, name)
        cached = self._texts.pop(key, None)
        if cached is not None and cached[0] is points and cached[1] <= len(points):
            _, done, text = cached
            if done < len(points):
                more = json.dumps(points[done:])[1:]  # "[a], [b]]" less its "["
                text = f"{text[:-1]}, {more}" if done else f"[{more}"
        else:
            text = json.dumps(points)
        self._texts[key] = (points, len(points), text)
        while len(self._texts) > self.max_curves:
            self._texts.popitem(last=False)
        return text


_points_text = PointsText()


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
