"""A running job's lease: the worker renews it while it works; the reaper takes back jobs
whose lease expired (a worker killed with kill -9, a host gone)."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from clockq.jobs.models import Job
from clockq.policy.states import JobState

log = logging.getLogger("clockq.lease")


def lease_until():
    return timezone.now() + timedelta(seconds=settings.CLOCKQ_LEASE_S)


class LeaseKeeper:
    """One daemon thread per worker process that renews the lease of the job it runs.

    Renewing from a thread, not only at slice boundaries, keeps the lease alive through a long
    step; a process that dies stops renewing, and that is exactly what the reaper looks for.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: tuple[int, str] | None = None
        self._wake = threading.Event()
        threading.Thread(target=self._run, name="clockq-lease", daemon=True).start()

    def hold(self, job_id: int, token: str) -> None:
        with self._lock:
            self._current = (job_id, token)

    def release(self) -> None:
        with self._lock:
            self._current = None

    def _run(self) -> None:
        while True:
            self._wake.wait(max(settings.CLOCKQ_LEASE_S / 4, 0.2))
            with self._lock:
                current = self._current
            if current is None:
                continue
            try:
                renew(*current)
            except Exception as exc:  # a database hiccup: try again at the next tick
                log.warning("lease renewal for job %s failed: %s", current[0], exc)
            finally:
                close_old_connections()


def renew(job_id: int, token: str) -> bool:
    return bool(
        Job.objects.filter(pk=job_id, state=JobState.RUNNING, dispatch_token=token).update(
            lease_expires_at=lease_until()
        )
    )
