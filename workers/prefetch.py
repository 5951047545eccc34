"""Prefetch on a GPU host: while the load forecast is low (the control state has prefetch on),
fetch or build the data of the queued jobs likely to run here, so that their first slice finds
it in CLOCKQ_CACHE_DIR instead of building it on the GPU's time.

"Likely to run here": the next queued jobs in dispatch order (tier, then age), as many as
CLOCKQ_PREFETCH_JOBS_PER_GPU per GPU of this host, leaving out those that fit none of its GPUs.
Any host may claim them, so every host prefetches the head of the queues; the cost is disk
space, which is what a quiet cluster has to spare.

It runs in the `gpuworkers` supervisor, one thread per host, and calls only the built-in
workloads' `prefetch` (a `command` job has none: its program is not ours to run early). Each
pass, prefetch on or off, it first trims the host's cache to its bounds (workers/data_cache.py),
so that the cache gives room back when something else fills its disk.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.db import close_old_connections

from clockq.control_state import control
from clockq.jobs.models import Job
from clockq.jobs.tier_rank import tier_rank
from clockq.policy.states import JobState
from workers.data_cache import CacheBounds, DataCache
from workers.gpus import Gpu
from workers.workloads import registry
from workers.workloads.base import Workload

log = logging.getLogger("clockq.prefetch")


def likely_jobs(gpus: Sequence[Gpu], limit: int) -> list[dict[str, Any]]:
    """The next `limit` queued jobs in dispatch order that fit one of these GPUs."""
    biggest = max((g.memory_total_mib or 0 for g in gpus), default=0)
    rows = (
        Job.objects.filter(state=JobState.QUEUED)
        .order_by(tier_rank("tier__code"), "enqueued_at", "id")
        .values("id", "workload", "params", "gpu_mem_mib")[: limit * 4]
    )
    fits = [r for r in rows if not r["gpu_mem_mib"] or not biggest or r["gpu_mem_mib"] <= biggest]
    return fits[:limit]


def prefetch_once(gpus: Sequence[Gpu], cache_dir: Path, per_gpu: int) -> list[int]:
    """One pass: if prefetch is on, prefetch for the likely jobs. Returns the ids of the jobs
    whose data was fetched or built in this pass."""
    if not control.admission().prefetch_on:
        return []
    fetched = []
    for row in likely_jobs(gpus, per_gpu * max(len(gpus), 1)):
        try:
            workload = registry.workload_class(row["workload"])
        except (KeyError, ImportError):
            continue  # not a workload of this host: it will fail its claim with the reason
        if workload.prefetch.__func__ is Workload.prefetch.__func__:  # type: ignore[attr-defined]
            continue  # nothing to fetch for this kind of job
        try:
            if workload.prefetch(row["params"], cache_dir):
                fetched.append(row["id"])
                log.info("prefetched the data of job %s (%s)", row["id"], row["workload"])
        except Exception:
            # A prefetch is only a head start: the job builds its data itself if this fails.
            log.exception("prefetch for job %s (%s) failed", row["id"], row["workload"])
    return fetched


class Prefetcher(threading.Thread):
    """Runs prefetch_once every `every_s` seconds until stopped; never lets an error end it."""

    def __init__(self, gpus: Sequence[Gpu], cache_dir: Path, every_s: float, per_gpu: int):
        super().__init__(name="prefetch", daemon=True)
        self.gpus, self.cache_dir, self.every_s, self.per_gpu = list(gpus), cache_dir, every_s, per_gpu
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.every_s):
            try:
                close_old_connections()
                DataCache(self.cache_dir, CacheBounds.from_settings()).trim()
                prefetch_once(self.gpus, self.cache_dir, self.per_gpu)
            except Exception:
                log.exception("prefetch pass failed; trying again in %s s", self.every_s)

    def stop(self) -> None:
        self.stopping.set()
