"""A GPU's standby RT lane, and pause in place (CLOCKQ_RT_LANE=on).

The lane is a second Celery worker on the GPU (`rt<N>@<host>`, the same CUDA_VISIBLE_DEVICES),
started warm by `gpuworkers`, that consumes only the `rt` queue. When it takes an RT job, the
policy (`clockq.policy.lanes.rt_lane_path`) says how the GPU's running job makes room:

- it pauses in place at its next step, its state where it is (no snapshot, no write, no
  requeue), when the RT job's declared memory fits beside it; it keeps its lease, and resumes
  when the RT job ends;
- otherwise it leaves through the checkpoint path at its next step, as it would make way for
  any RT job, and its worker claims nothing until the RT job ends.

This module is the lane's side. The lane asks through one fact, its pause request in Redis
(clockq/bus/lanes.py); the paused worker's side, which reads it, is beside the step loop
(workers/run/pause.py: `PauseWatch`, `wait_while_lent`).

Crash safety. A lane's processes hold its life lock, an flock, for as long as they live, and
claim nothing without it (workers/lane_life.py). The GPU's main worker waits on that
lock in a thread (`LaneWatch`): the instant a lane dies (kill -9 included), the main worker holds
the lock, knows the lane is dead, takes the lane's RT job back to the `rt` queue from its last
checkpoint (the reaper's rule, `clockq.jobs.take_back`), and drops the lane's pause request, so
the paused job resumes, or the worker lent to the lane claims again, and the RT job runs again
within RT's start timeout: on this GPU, another, or the lane's next process. The pause request
also lives in Redis with a short TTL that the lane renews while its RT job runs
(clockq/bus/lanes.py), so a paused job resumes within `lanes.PAUSE_TTL_S` even where no watch
runs. A paused worker killed with kill -9 loses its job's current slice only: its lease runs out
and the reaper takes the job back from its last checkpoint. A pause never lasts longer than
CLOCKQ_PAUSE_MAX_S: past it, the paused job leaves through the checkpoint path.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from celery.signals import worker_init, worker_process_init
from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import Q
from redis import RedisError

from clockq.bus import free_gpus, heartbeat, lanes, signals
from clockq.bus.client import client
from clockq.jobs.models import Job
from clockq.policy.lanes import LanePath, LaneView, rt_lane_path
from clockq.policy.states import JobState
from workers import runtime as runtimes
from workers.lane_life import LaneLock, LaneLockError, take_back_orphans
from workers.run.claim import ClaimedJob, claim_message_job, give_back
from workers.runtime import Runtime

log = logging.getLogger("clockq.rt_lane")

LANE_NAME_ENV = "CLOCKQ_RT_LANE_NAME"
LISTEN_WAIT_S = 5.0
POLL_S = 0.005  # how often a lane looks whether its main worker's job has left (checkpoint path)
_life: LaneLock | None = None  # in a lane's processes: its life lock, held until they exit


def rt_lane_env(main: str) -> dict[str, str]:
    """The environment of the RT lane of the GPU whose main worker is `main` (gpu<N>@<host>)."""
    return {heartbeat.RT_LANE_OF_ENV: main, LANE_NAME_ENV: lanes.lane_name(main)}


# --- the lane's side -------------------------------------------------------------------------


class Lane:
    """The RT lane a process is, if it is one."""

    def __init__(self, runtime: Runtime, main: str):
        self.runtime = runtime
        self.main = main
        self.name = runtime.identity.hostname
        self._stop_keeping = threading.Event()  # stops renewing the pause request of the current RT job
        self._left_elsewhere: set[int] = set()  # RT jobs this lane left to a free GPU (once each)

    @classmethod
    def of(cls, runtime: Runtime) -> Lane | None:
        main = runtime.identity.lane_of
        return cls(runtime, main) if main is not None else None

    def claim(self, job_id: int, token: str) -> ClaimedJob | None:
        """Make room on the GPU for the RT job, then claim it (the room first: on a real GPU the
        claim checks that the job fits in the free memory). None if the message is stale, or
        if this process does not hold the lane's life lock: without it, its death could not be
        known for sure, and its job would wait for the reaper."""
        if not _holds_life(self.name):
            give_back(job_id, token, self.runtime)
            return None
        lanes.mark_busy(client(), self.name)  # before anything: no look counts this lane idle now
        path, target = self._path(job_id, token)
        if path == LanePath.ELSEWHERE:
            # Back to the rt queue, where the free GPU's worker has waited longer than this
            # lane will (Redis serves blocked consumers first come, first served).
            self._left_elsewhere.add(job_id)
            give_back(job_id, token, self.runtime)
        if path in (None, LanePath.ELSEWHERE):
            lanes.mark_idle(client(), self.name)
            return None
        self._make_room(job_id, path, target)
        job = claim_message_job(job_id, token, self.runtime)
        if job is None:
            self._give_room_back(job_id)
            return None
        lanes.count_served(client(), path)
        log.info("RT job %s in lane %s: %s (job %s on %s)", job_id, self.name, path, target, self.main)
        return job

    @contextmanager
    def turn(self, job: ClaimedJob) -> Iterator[None]:
        """Run the RT job `job` (the body), then give the room back: the paused job resumes."""
        try:
            yield
        finally:
            self._give_room_back(job.id)

    def _make_room(self, rt_job: int, path: LanePath, target: int | None) -> None:
        mode = lanes.MODE_CHECKPOINT if path == LanePath.CHECKPOINT else lanes.MODE_PAUSE
        request = lanes.PauseRequest(rt_job=rt_job, lane=self.name, mode=mode, target=target)
        self._stop_keeping = threading.Event()
        lanes.request_pause(client(), self.main, request)
        threading.Thread(
            target=self._keep, args=(rt_job, self._stop_keeping), name="clockq-lane-keep", daemon=True
        ).start()
        if path == LanePath.CHECKPOINT and target is not None:
            self._wait_until_left(target)

    def _give_room_back(self, rt_job: int) -> None:
        self._stop_keeping.set()
        try:
            lanes.release(client(), self.main, rt_job)
            lanes.mark_idle(client(), self.name)
        except RedisError as exc:  # the request expires on its own; the idle mark comes back with the next turn
            log.warning("lane %s could not release %s: %s", self.name, self.main, exc)

    def _path(self, rt_job: int, token: str) -> tuple[LanePath | None, int | None]:
        """The policy's way to the GPU for `rt_job` (None if its message is stale), and the main
        worker's running job, if any. One read of the database."""
        rows = {
            row[0]: row
            for row in Job.objects.filter(Q(pk=rt_job) | Q(state=JobState.RUNNING, worker=self.main)).values_list(
                "id", "gpu_mem_mib", "state", "dispatch_token"
            )
        }
        rt = rows.pop(rt_job, None)
        if rt is None or rt[2] != JobState.QUEUED or rt[3] != token:
            return None, None
        running = next(iter(rows.values()), None)
        identity = self.runtime.identity
        view = LaneView(
            rt_mem_mib=rt[1],
            running_mem_mib=running[1] if running is not None else None,
            running=running is not None,
            free_mib=None if identity.simulated else self.runtime.threads.probe.free_memory_mib(),
            total_mib=identity.memory_total_mib,
            free_elsewhere=0 if running is None or rt_job in self._left_elsewhere else self._free_gpus_elsewhere(),
        )
        return rt_lane_path(view), running[0] if running is not None else None

    def _free_gpus_elsewhere(self) -> int:
        """The free GPUs (clockq/bus/free_gpus.py) that would take this RT job if the lane put it
        back in the queue: where it starts without making any job pause. 0 when the broker
        cannot say."""
        try:
            mains = free_gpus.idle_candidates(heartbeat.live_workers(), besides=self.main)
        except RedisError:
            return 0
        if not mains:
            return 0
        busy = Job.objects.filter(state=JobState.RUNNING, worker__in=mains).values_list("worker", flat=True)
        return len(free_gpus.free_of(mains, set(busy)))

    def _wait_until_left(self, target: int) -> None:
        """The checkpoint path: the RT job does not fit beside the running job, which leaves at
        its next step. Wait for that (the database says when), at most CLOCKQ_PAUSE_MAX_S."""
        deadline = time.monotonic() + settings.CLOCKQ_PAUSE_MAX_S
        running = Job.objects.filter(pk=target, state=JobState.RUNNING, worker=self.main)
        while running.exists():
            if time.monotonic() > deadline:
                log.warning(
                    "job %s on %s has not left for RT job in %s; running beside it", target, self.main, self.name
                )
                return
            time.sleep(POLL_S)

    def _keep(self, rt_job: int, stop: threading.Event) -> None:
        """Renew the pause request while the RT job runs: a lane that dies stops renewing it."""
        while not stop.wait(lanes.PAUSE_TTL_S / 4):
            try:
                lanes.keep_pause(client(), self.main, rt_job)
            except RedisError as exc:
                log.warning("lane %s could not renew its pause request: %s", self.name, exc)


@worker_init.connect
def _take_life(**_kwargs) -> None:
    """A lane's main process takes its life lock before it forks its pool process, which shares
    it (the same open file): the lock comes free only when both are dead. Until it has it, the
    lane takes no message: a process of the lane before it, not dead yet, still holds it. A lock
    folder that cannot hold it stops the lane, saying why (the GPU serves RT jobs without it)."""
    global _life
    name = os.environ.get(LANE_NAME_ENV)
    if not name or not os.environ.get(heartbeat.RT_LANE_OF_ENV):
        return
    lock = LaneLock(name)
    try:
        if not lock.try_take():
            log.warning(
                "lane %s: waiting for its life lock %s (a process of the lane before it not dead yet, "
                "or its GPU's main worker taking back its jobs)",
                name,
                lock.path,
            )
            lock.take()
    except LaneLockError as exc:
        raise SystemExit(f"RT lane {name} cannot start: {exc}") from None
    _life = lock


def _holds_life(name: str) -> bool:
    """Whether this process holds its lane's life lock (through its main process), as it must
    to claim: without it, its death could not be known for sure, and its job would wait for
    the reaper."""
    if _life is not None and _life.held:
        return True
    log.error("lane %s: this process does not hold the lane's life lock; claiming nothing", name)
    return False


@worker_process_init.connect
def _start_warm(**_kwargs) -> None:
    """A lane's pool process takes back the jobs of the lane's previous processes, dead, since
    it holds the lane's life lock; then it does what a first job would wait for: its runtime,
    its signal subscription, its database and broker connections. Then it counts as idle."""
    name = os.environ.get(LANE_NAME_ENV)
    if not name or not os.environ.get(heartbeat.RT_LANE_OF_ENV) or not _holds_life(name):
        return
    try:
        take_back_orphans(name, actor=name)
    except (DatabaseError, RedisError) as exc:  # the main worker's watch or the reaper does it
        log.warning("lane %s: could not take back the jobs of its previous process: %s", name, exc)
    try:
        runtime = runtimes.for_worker(name)
        signals.wait_until_listening(LISTEN_WAIT_S)
        _ = runtime.threads.leases, runtime.threads.boundary_reader, runtime.threads.probe
        connection.ensure_connection()
        lanes.mark_idle(client(), name)
    except Exception as exc:  # warming up is an optimisation: the first RT job does the rest
        log.warning("lane %s: warm start incomplete (%s)", name, exc)
