"""The metric curves a workload reports as it steps (loss, accuracy, …), kept with its work.

Points are saved with a checkpoint or the finish, never ahead of them: a slice that is lost or
rolled back takes its points with it, so the curves never run past the work that was kept.
"""

from __future__ import annotations

import logging

from clockq.jobs import metrics as job_metrics
from clockq.policy.metrics import Series
from clockq.policy.metrics import clean as clean_metrics

log = logging.getLogger("clockq.slices")


class MetricsRecorder:
    """One claim's view of a job's curves: loaded when the workload first reports a point."""

    def __init__(self, job_id: int):
        self.job_id = job_id
        self.curves: dict[str, Series] | None = None
        self.changed: set[str] = set()  # names with points not saved yet
        self.stored: set[str] = set()  # names with a row in the database
        self.warned = False
        self.last_step: int | None = None

    def adopt(self, curves: dict[str, Series] | None) -> None:
        """A warm restore: the curves saved with the checkpoint the workload is still at."""
        self.curves = curves
        self.stored = set(curves or ())

    def record(self, records) -> None:
        if self.curves is None:
            self.curves = job_metrics.load(self.job_id)
            self.stored = set(self.curves)
        kept, problems = clean_metrics(records, set(self.curves))
        if problems and not self.warned:  # once a claim: a program may send junk every step
            self.warned = True
            log.warning("job %s: metric records dropped: %s", self.job_id, "; ".join(problems[:3]))
        for step, name, value in kept:
            self.curves.setdefault(name, Series()).add(step, value)
            self.last_step = step if self.last_step is None else max(self.last_step, step)
            self.changed.add(name)

    def save(self) -> None:
        """With a checkpoint (or the finish), in the transaction that names it."""
        if self.curves is not None and self.changed:
            job_metrics.save(self.job_id, self.curves, self.changed, self.stored)
            self.stored |= self.changed
            self.changed = set()

    def forget(self) -> None:
        """The slice's work is rolled back: its points go with it."""
        self.curves, self.changed = None, set()
