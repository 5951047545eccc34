"""The beat role's scheduler: django-celery-beat's DatabaseScheduler (operators edit the
schedule in the admin), run by one beat at a time (clockq/bus/beat_lock.py).

Start as many beats as you like, on any hosts: one leads and sends the periodic tasks, the
others wait, trying the lock every WAIT_TICK_S, and the first to get it after the leader dies
takes over within one lease (CLOCKQ_BEAT_LOCK_S). A new leader reads the schedule afresh from
the database, where the last leader kept it.

The schedule is clockq/jobs/periodic.py's, the one list of periodic tasks: at its start a beat
writes the tasks it owns (`beat_schedule`), in place of Celery's own beat_schedule setting."""

from __future__ import annotations

import logging

from django.conf import settings
from django_celery_beat.schedulers import DatabaseScheduler

from clockq.bus.beat_lock import BeatLock, holder_token, leader
from clockq.bus.client import client
from clockq.jobs import periodic

log = logging.getLogger("clockq.beat")

WAIT_TICK_S = 1.0


class LockedDatabaseScheduler(DatabaseScheduler):
    def __init__(self, *args, **kwargs) -> None:
        self.lease_s = settings.CLOCKQ_BEAT_LOCK_S
        self.lock = BeatLock(client(), self.lease_s, holder_token(settings.CLOCKQ_HOST))
        self.leads: bool | None = None  # None until the first tick
        super().__init__(*args, **kwargs)

    def setup_schedule(self) -> None:
        self.install_default_entries(self.schedule)
        self.update_from_dict(periodic.beat_schedule())

    def tick(self, *args, **kwargs) -> float:
        if not self.lock.hold():
            if self.leads is not False:
                log.info("beat %s waits: %s holds the beat lock", self.lock.token, _leader_or_nobody())
                self.leads = False
            return WAIT_TICK_S
        if not self.leads:
            self.leads = True
            log.info("beat %s took the beat lock: it sends the periodic tasks", self.lock.token)
            self._read_schedule_afresh()
        # Renew well within the lease, however long the schedule lets beat sleep.
        return min(super().tick(*args, **kwargs), self.lease_s / 3)

    def _read_schedule_afresh(self) -> None:
        """What the last leader ran is in the database; the schedule in memory is from this
        beat's start."""
        self._initial_read = True
        self._heap = None
        self._heap_invalidated = True

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.lock.release()


def _leader_or_nobody() -> str:
    try:
        return leader(client()) or "nobody (yet)"
    except Exception:
        return "(the broker does not answer)"
