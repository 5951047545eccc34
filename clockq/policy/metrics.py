"""A job's metric curves, kept bounded however long the job runs. Pure.

Every point is kept while a series is short. Past `max_points` every other point is dropped and
the spacing between kept steps doubles, so a curve of a million steps still holds at most
`max_points` evenly spaced points, plus the newest value, which is always kept.

A step reported again means the job re-ran it: it resumed from a checkpoint older than the work
already recorded (a fallback after a corrupt generation). The points from that step on are
dropped first, so a curve never shows a step twice.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_POINTS = 1000
MAX_NAMES = 20  # per job: a program reporting more is cut off, not the database filled
NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.]{0,63}$")


@dataclass
class Series:
    points: list[tuple[int, float]] = field(default_factory=list)  # on the grid of `stride`
    stride: int = 1  # the smallest gap between kept steps
    last: tuple[int, float] | None = None  # the newest point when it is not on the grid

    def add(self, step: int, value: float, max_points: int = MAX_POINTS) -> None:
        if (self.last and self.last[0] >= step) or (self.points and self.points[-1][0] >= step):
            self._forget_from(step)
        if not self.points or step - self.points[-1][0] >= self.stride:
            self.points.append((step, value))
            self.last = None
            if len(self.points) > max_points:
                self.points = self.points[::2]
                self.stride *= 2
        else:
            self.last = (step, value)

    def view(self) -> list[tuple[int, float]]:
        return self.points + ([self.last] if self.last else [])

    def latest(self) -> tuple[int, float] | None:
        return self.last or (self.points[-1] if self.points else None)

    def _forget_from(self, step: int) -> None:
        self.points = [p for p in self.points if p[0] < step]
        if self.last and self.last[0] >= step:
            self.last = None


def clean(records: Iterable[tuple[int, str, float]], known: set[str]) -> tuple[list[tuple[int, str, float]], list[str]]:
    """The records worth keeping, and why others were not: a step must be a non-negative
    integer, a name plain and short, a value a finite number, and a job has at most MAX_NAMES
    names (`known` are the ones it has already)."""
    kept, problems = [], []
    names = set(known)
    for step, name, value in records:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            problems.append(f"step {step!r} is not a non-negative integer")
        elif not isinstance(name, str) or not NAME.match(name):
            problems.append(f"metric name {str(name)[:40]!r} is not allowed")
        elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            problems.append(f"{name}: {str(value)[:40]!r} is not a finite number")
        elif name not in names and len(names) >= MAX_NAMES:
            problems.append(f"{name}: a job reports at most {MAX_NAMES} metrics")
        else:
            names.add(name)
            kept.append((step, name, float(value)))
    return kept, problems
