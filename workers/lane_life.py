"""A GPU's RT lane's life as the kernel sees it: an flock the lane holds while its process lives.

A lease or a heartbeat that is late says that a worker may be dead, not that it is: a worker
stalled on a slow disk renews late and goes on. Taking its job back then would run the job
twice at once (DESIGN.md, invariant 1), so the reaper waits out the whole lease (CLOCKQ_LEASE_S,
20 s), and an RT job whose lane died waited that long, where its start timeout is 1 s.

The kernel releases an flock the instant the last descriptor of its open file closes: when the
processes that hold it die, however they die. A lane's main process takes its lane's lock
before it takes a message or forks its pool process (the one that runs its jobs), which shares
the lock's open file: the lock comes free only once both are dead (Celery kills the pool process
with SIGKILL when its parent dies: PR_SET_PDEATHSIG). So whoever else holds the lock knows that
no process of that lane lives, and that none can claim while it holds it: every job running
under the lane's name is an orphan, and it takes each back (`take_back_orphans`).

- The GPU's main worker, on the same host, waits on the lock in a thread (`LaneWatch`, in its
  pool process): it gets it the instant the lane dies, takes the lane's RT job back to the `rt`
  queue, drops the lane's pause request (the paused job resumes), and gives the lock up for
  the lane's next process.
- A lane's next pool process takes back its predecessors' jobs itself: its lock says that no
  earlier process of the lane lives (a pool process that died alone, its parent alive, leaves
  the lock held, so its job waits for this, or the reaper).
- A lane whose lock is held waits for it before it takes a message; one whose pool process does
  not share it claims nothing (no lock, no proof of its death later).

One file per lane and broker in CLOCKQ_LANE_LOCK_DIR: worker names are unique per broker
(clockq/bus/names.py), not per host, so two deployments on one host (two test runs) each have
an rt0@host. The files are never removed: a waiter on a removed file would hold a lock that no
new lane process takes, and take the jobs of a live lane back.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import stat
import threading
import time
from pathlib import Path

from celery.signals import worker_process_init
from django.conf import settings
from django.db import DatabaseError, close_old_connections
from django.utils import timezone
from redis import RedisError

from clockq.bus import heartbeat, lanes
from clockq.bus.client import client
from clockq.jobs.models import Job
from clockq.jobs.take_back import LostRun, take_back

log = logging.getLogger("clockq.rt_lane")

ABSENT_LOOK_S = 0.5  # while no lane process holds the lock (starting, restarting): look this often
TAKE_POLL_S = 0.01  # how often a lane tries its lock while the main worker's watch holds it


class LaneLockError(RuntimeError):
    """The lock directory cannot hold a lane's lock safely (not ours, writable by others, ...)."""


class LaneLock:
    """The life lock of the RT lane `lane`, on this host, for this deployment's broker."""

    def __init__(self, lane: str, directory: Path | None = None, broker_url: str | None = None):
        self.lane = lane
        self.directory = Path(directory or settings.CLOCKQ_LANE_LOCK_DIR)
        broker = (broker_url or settings.REDIS_URL).encode()
        self.path = self.directory / f"{hashlib.sha256(broker).hexdigest()[:16]}-{lane}.lock"
        self._fd: int | None = None
        self.held = False

    def try_take(self) -> bool:
        """Take the lock if no one holds it; at once, never waiting."""
        try:
            fcntl.flock(self._open(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self.held = True
        return True

    def take(self, timeout: float | None = None) -> bool:
        """Take the lock, waiting for it: with no `timeout`, until its holder lets go or dies."""
        if timeout is None:
            fcntl.flock(self._open(), fcntl.LOCK_EX)  # the GIL is released while it waits
            self.held = True
            return True
        deadline = time.monotonic() + timeout
        while not self.try_take():
            if time.monotonic() > deadline:
                return False
            time.sleep(TAKE_POLL_S)
        return True

    def release(self) -> None:
        if self._fd is not None and self.held:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self.held = False

    def _open(self) -> int:
        if self._fd is None:
            self._check_directory()
            # O_CLOEXEC: a program the process starts does not keep the lane looking alive.
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise LaneLockError(f"cannot open {self.path}: {exc}") from exc
        return self._fd

    def _check_directory(self) -> None:
        """The directory is ours and no one else may write in it: another user could otherwise
        put another file in place of the lock, and make a live lane look dead."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = os.lstat(self.directory)
        except OSError as exc:
            raise LaneLockError(f"cannot make {self.directory} (CLOCKQ_LANE_LOCK_DIR): {exc}") from exc
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise LaneLockError(
                f"{self.directory} (CLOCKQ_LANE_LOCK_DIR) must be a folder of this user's that no one else may "
                f"write in (owner {info.st_uid}, mode {stat.filemode(info.st_mode)})"
            )


def take_back_orphans(lane: str, *, actor: str) -> list[int]:
    """The caller holds `lane`'s lock: no process of that lane lives. Drop the pause request it
    made of its main worker (the paused job resumes, a lent worker claims again), then take back
    the jobs running under its name (its RT job). The request goes first so that the worker
    that claims the RT job again never finds it standing, as if it had to pause for itself. The
    ids of the jobs taken back."""
    main = lanes.main_of(lane)
    if main is not None:
        lanes.drop_request_of(client(), main, lane)
    why = f"its worker {lane} died (its lane lock came free on {settings.CLOCKQ_HOST})"
    now = timezone.now()
    runs = LostRun.of(Job.objects.filter(worker=lane))
    taken = [run.job_id for run in runs if take_back(run, lost_at=now, why=why, actor=actor)]
    if taken:
        log.warning("lane %s died: took back its job(s) %s", lane, taken)
    return taken


class LaneWatch:
    """A GPU's main worker's watch over its RT lane: a thread that waits on the lane's lock and
    takes back the lane's jobs whenever it gets it (`take_back_orphans`). `lost` says which RT
    jobs it took back, and when (time.monotonic), for the paused job's record
    (workers/run/pause.py)."""

    def __init__(self, main: str, lock: LaneLock | None = None):
        self.main = main
        self.lane = lanes.lane_name(main)
        self.lock = lock or LaneLock(self.lane)
        self.lost: dict[int, float] = {}
        self.thread = threading.Thread(target=self._run, name="clockq-lane-watch", daemon=True)

    def start(self) -> LaneWatch:
        self.thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                self.watch_once()
            except LaneLockError as exc:
                log.error("%s: no watch over its RT lane (its jobs wait for the reaper): %s", self.main, exc)
                return
            except (DatabaseError, RedisError, OSError) as exc:
                log.warning("%s: could not take back the jobs of its dead RT lane %s: %s", self.main, self.lane, exc)
            time.sleep(ABSENT_LOOK_S)

    def watch_once(self) -> list[int]:
        """Wait for the lane's lock (at once if no lane process holds it, else until the lane
        dies), take the lane's jobs back, and let the lock go. The ids taken back."""
        if not self.lock.try_take():
            self.lock.take()  # blocks while the lane lives; returns the instant it dies
        try:
            close_old_connections()  # this thread's connection may have been idle for days
            standing = lanes.pause_request(client(), self.main)
            if standing is not None and standing.lane == self.lane:
                self.lost[standing.rt_job] = time.monotonic()  # before its drop wakes the paused job
            taken = take_back_orphans(self.lane, actor=self.main)
            self.lost.update(dict.fromkeys(taken, time.monotonic()))
            return taken
        finally:
            with contextlib.suppress(OSError):
                self.lock.release()


_watch: LaneWatch | None = None  # in a main worker's pool process: its watch over its lane


@worker_process_init.connect
def _watch_the_lane(sender=None, **_kwargs) -> None:
    """A GPU's main worker's pool process watches its lane from its start (`LaneWatch`)."""
    global _watch
    main = sender if isinstance(sender, str) else None
    is_main = int(os.environ.get("CLOCKQ_GPU_INDEX", "-1")) >= 0 and not os.environ.get(heartbeat.RT_LANE_OF_ENV)
    if not settings.CLOCKQ_RT_LANE or not is_main or main is None or lanes.main_of(lanes.lane_name(main)) != main:
        return
    _watch = LaneWatch(main).start()


def lane_lost(rt_job: int, since: float) -> bool:
    """Whether this worker's watch took `rt_job` back from its dead lane at `since`
    (time.monotonic) or later: a paused job's record then says "lane gone". Not earlier: an RT
    job taken back once and run again in the lane's next process ends there as any other."""
    return _watch is not None and _watch.lost.get(rt_job, float("-inf")) >= since
