"""Warm resume: keep the live workloads this worker last yielded, within a memory bound.

When the same job comes back to the same worker and the database still names the checkpoint this
worker yielded it at, its workload object is still here, so the worker skips reading, verifying
and loading the checkpoint (and, for Keras, rebuilding the model). The durable checkpoint is
still written at every yield, because any worker may take the job next.

Entries are keyed by the checkpoint's file name, which carries its generation and the claim that
wrote it (clockq/jobs/checkpoints.py). Names are never reused, so an entry can only match the very
checkpoint it was saved at: not one of the same number written after a fallback, nor one written
by another claim.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings

from clockq.policy.metrics import Series
from workers.workloads.base import Workload

log = logging.getLogger("clockq.warm")

# Placement affinity (clockq/policy/affinity.py): how long a free GPU leaves a job yielded on
# another worker, which holds it warm and is busy, to that worker (settings.CLOCKQ_WARM_WAIT_S).
WARM_WAIT_S: float = settings.CLOCKQ_WARM_WAIT_S


@dataclass
class Warm:
    """A yielded job as this worker left it: its workload, and its metric curves as saved with
    that checkpoint (so a warm resume reads neither back)."""

    workload: Workload
    curves: dict[str, Series] | None = None


@dataclass
class _Entry:
    checkpoint: str
    warm: Warm
    nbytes: int


class WarmCache:
    def __init__(self, max_bytes: int, max_jobs: int, before_close: Callable[[int], None] | None = None):
        self.max_bytes = max_bytes
        self.max_jobs = max_jobs
        # Called with the job id before a workload is closed: its snapshot may still be copied
        # out of it in the background (Persister.settle).
        self.before_close = before_close
        self._entries: OrderedDict[int, _Entry] = OrderedDict()

    def put(
        self, job_id: int, checkpoint: str, workload: Workload, nbytes: int, curves: dict[str, Series] | None = None
    ) -> None:
        self.drop(job_id)
        if self.max_jobs <= 0 or nbytes > self.max_bytes:
            self._close_entry(job_id, workload)
            return
        self._entries[job_id] = _Entry(checkpoint, Warm(workload, curves), nbytes)
        while len(self._entries) > self.max_jobs or sum(e.nbytes for e in self._entries.values()) > self.max_bytes:
            oldest_job, oldest = self._entries.popitem(last=False)
            self._close_entry(oldest_job, oldest.warm.workload)

    def take(self, job_id: int, checkpoint: str) -> Warm | None:
        """The cached job if it is exactly at `checkpoint`; a stale entry is dropped."""
        entry = self._entries.pop(job_id, None)
        if entry is None:
            return None
        if entry.checkpoint != checkpoint:
            self._close_entry(job_id, entry.warm.workload)
            return None
        return entry.warm

    def drop(self, job_id: int) -> None:
        entry = self._entries.pop(job_id, None)
        if entry is not None:
            self._close_entry(job_id, entry.warm.workload)

    def _close_entry(self, job_id: int, workload: Workload) -> None:
        if self.before_close is not None:
            self.before_close(job_id)
        _close(workload)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)


def _close(workload: Workload) -> None:
    try:
        workload.close()
    except Exception:
        log.exception("closing an evicted workload failed")
