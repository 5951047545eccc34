"""Soak: kill -9 of a random GPU worker 100 times over a run of 200 jobs.

Real processes: `manage.py gpuworkers` with simulated GPUs restarts each Celery worker that
dies. Nothing runs beat here, so a thread of this test runs the lease reaper and the reconciler
every half second, as beat would (more often, to keep the run short).

What is measured, and what each word means:

- lost: a job that is not `succeeded` at the end. Every job must succeed; a kill is not the
  job's fault, so no job may fail, nor count a failure, because of one.
- run twice: a job two of whose slices overlap in time (two workers ran it at once), or whose
  steps across its slices that were not rolled back exceed its `steps`. Those steps add up to
  exactly its `steps`: work lost with a killed worker mid-slice is in no recorded slice (the
  reaper records that slice as `lost`, with 0 steps), and a recorded slice whose steps the job
  runs again is marked `rolled_back`. That happens when a kill takes with it a checkpoint that
  the slice's end named but whose write, in the background after the switch
  (workers/persister.py), had not finished: the next claim resumes from the generation before,
  by design, and runs that slice's steps again. Counted as if kept, they would be counted
  twice. Here every slice that continues takes a checkpoint (CLOCKQ_CHECKPOINT_EVERY_S is
  tiny), so a persist is in flight at most boundaries, when the kills come.
- kill that hit a running job: the killed worker held a job, shown by the `lost` slice the
  reaper recorded for that worker, begun before the kill (or just after: the pool child that
  runs jobs outlives its parent by a moment) and ended (its lease expired) after it. A kill of
  an idle worker has no job to resume. A `lost` slice that no kill explains would be a live
  worker that lost its lease; it is printed, with the kills of that worker near it.
- time to resume: for each kill that hit a running job, from the kill to the start of that
  job's next slice (on whichever worker claimed it next).

Each kill picks one Celery worker at random among those that are up (their heartbeat names
their current pid). The test does not wait for the killed worker to come back. It keeps a few
jobs waiting beyond the GPUs that are up, so a job taken back waits behind a few others, not
behind the whole run, and it paces the kills with the jobs done, so that they fall across the
run (all of them before the last tenth of the jobs).
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections

from clockq.bus.client import client
from clockq.bus.heartbeat import KEY_PREFIX
from clockq.jobs.models import Job, JobEvent, Slice
from clockq.policy.states import TERMINAL_STATES
from control.reaper import reap_expired_leases
from control.reconcile import reconcile_queued_jobs
from tests.helpers import submit

pytestmark = [pytest.mark.slow, pytest.mark.integration]

JOBS = 200
KILLS = 100
# Twelve GPUs, not four: gpuworkers restarts a dead worker after a backoff that doubles with
# each death (1, 2, 4 ... 30 s) and resets only after 60 s up. A hundred kills over four GPUs
# would leave each of them down for 30 s after nearly every kill, and the run would take over
# ten minutes; over twelve it takes about three (with two of the twelve up, on average).
GPUS = 12
LEASE_S = 2.0
KILL_GAP_S = 0.5  # at least this long between two kills
KILLS_BY = 0.9  # the last kill comes once this part of the jobs is done
STEPS, STEP_MS = 30, 50  # about 1.5 s of work per job, in 50 ms steps
EXTRA_IN_FLIGHT = 3  # jobs waiting beyond one per GPU that is up
RUN_TIMEOUT_S = 480


@dataclass
class Kill:
    at: datetime
    pid: int
    hostname: str
    job_id: int | None = None  # the running job it hit (known from the lost slice the reaper records)
    resumed_after_s: float | None = None


class Maintenance(threading.Thread):
    """What beat would run: the lease reaper and the reconciler, every `every_s`."""

    def __init__(self, every_s: float = 0.5):
        super().__init__(name="soak-maintenance", daemon=True)
        self.every_s = every_s
        self.stopping = threading.Event()
        self.reaped = 0
        self.redispatched = 0
        self.errors: list[str] = []

    def run(self) -> None:
        try:
            while not self.stopping.wait(self.every_s):
                try:
                    self.reaped += reap_expired_leases()
                    self.redispatched += reconcile_queued_jobs()
                except Exception as exc:  # a locked database: the next pass tries again
                    self.errors.append(repr(exc))
        finally:
            connections.close_all()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)


def _hostname_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().decode().split("\0")
    except OSError:
        return None
    return argv[argv.index("--hostname") + 1] if "--hostname" in argv else None


def _ready_workers(pids: list[int], killed: set[int]) -> list[tuple[int, str]]:
    """(pid, hostname) of the GPU workers that are up: started and heartbeating as this pid."""
    ready = []
    for pid in pids:
        hostname = None if pid in killed else _hostname_of(pid)
        if hostname is None:
            continue
        raw = client().get(KEY_PREFIX + hostname)
        if raw and json.loads(raw).get("pid") == pid:
            ready.append((pid, hostname))
    return ready


def _active(ids: list[int]) -> int:
    return Job.objects.filter(pk__in=ids).exclude(state__in=TERMINAL_STATES).count()


def _overlap(rows: list[Slice]) -> bool:
    """Whether any two of these slices (sorted by start) overlap in time."""
    ended = None
    for s in rows:
        if ended is not None and s.started_at < ended:
            return True
        ended = s.ended_at if ended is None else max(ended, s.ended_at)
    return False


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


@dataclass
class Run:
    """What the kill loop did: the jobs it submitted, its kills, and how many GPU workers were up."""

    ids: list[int] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    ready_counts: list[int] = field(default_factory=list)
    wall_s: float = 0.0


def _submit_and_kill(workers, alice) -> Run:
    """Keep a few jobs waiting beyond the GPUs that are up and kill -9 a random ready worker at
    a pace set by the jobs done, until every job is done and every kill made."""
    rng = random.Random(7)
    run = Run()
    killed_pids: set[int] = set()
    started = time.monotonic()
    next_kill = started + KILL_GAP_S
    while True:
        now = time.monotonic()
        active = _active(run.ids)
        done = len(run.ids) - active
        assert now - started < RUN_TIMEOUT_S, (
            f"the run did not end in {RUN_TIMEOUT_S} s: {done} of {JOBS} jobs done, {len(run.kills)} kills"
        )
        ready = _ready_workers(workers.worker_pids(), killed_pids)
        run.ready_counts.append(len(ready))
        # A few jobs wait beyond those the GPUs that are up can run.
        while len(run.ids) < JOBS and active < len(ready) + EXTRA_IN_FLIGHT:
            run.ids.append(submit(alice, "SP", f"soak-{len(run.ids)}", steps=STEPS, step_ms=STEP_MS, state_kb=4).pk)
            active += 1
        # Kills keep pace with the jobs done, all of them within the first KILLS_BY of the run.
        due = len(run.kills) < min(KILLS, KILLS * done / (KILLS_BY * JOBS) + 1)
        if due and ready and now >= next_kill:
            pid, hostname = rng.choice(ready)
            os.kill(pid, signal.SIGKILL)  # its pool child dies with it (PR_SET_PDEATHSIG)
            run.kills.append(Kill(datetime.now(UTC), pid, hostname))
            killed_pids.add(pid)
            next_kill = now + KILL_GAP_S
        if len(run.ids) == JOBS and active == 0 and len(run.kills) == KILLS:
            run.wall_s = time.monotonic() - started
            return run
        time.sleep(0.1)


def _match_kills(kills: list[Kill], slices: dict[int, list[Slice]], ids: list[int]) -> tuple[list[float], list[Slice]]:
    """Which kills hit a running job, and how long until that job ran again (set on each Kill).
    The pool child that runs jobs dies a moment after its parent (PR_SET_PDEATHSIG), so it may
    still claim a job just after the kill: hence the small allowance on the lost slice's start.
    Returns the times from a kill to the reaper taking its job back, and the lost slices that no
    kill explains."""
    lost_slices = [s for rows in slices.values() for s in rows if s.outcome == "lost"]
    reaped_at: dict[int, list[datetime]] = {}
    for job_id, at in JobEvent.objects.filter(job_id__in=ids, actor="reaper").values_list("job_id", "at"):
        reaped_at.setdefault(job_id, []).append(at)
    explained: set[int] = set()
    detect: list[float] = []  # kill -> the reaper takes the job back
    for kill in kills:
        for s in lost_slices:
            if (
                s.pk not in explained
                and s.worker == kill.hostname
                and s.started_at <= kill.at + timedelta(seconds=1)
                and kill.at < s.ended_at
            ):
                explained.add(s.pk)
                kill.job_id = s.job_id
                after = [t.started_at for t in slices[s.job_id] if t.started_at > kill.at]
                if after:
                    kill.resumed_after_s = (min(after) - kill.at).total_seconds()
                reaped = [t for t in reaped_at.get(s.job_id, []) if t > kill.at]
                if reaped:
                    detect.append((min(reaped) - kill.at).total_seconds())
                break
    return detect, [s for s in lost_slices if s.pk not in explained]


def _print_report(run: Run, jobs, slices, detect, unexplained, maintenance, lost, twice) -> None:
    kills = run.kills
    hits = [k for k in kills if k.job_id is not None]
    resumes = [k.resumed_after_s for k in hits if k.resumed_after_s is not None]
    lost_slices = sum(s.outcome == "lost" for rows in slices.values() for s in rows)
    rolled_back = [s for rows in slices.values() for s in rows if s.rolled_back]
    kills_per_worker = {h: sum(k.hostname == h for k in kills) for h in sorted({k.hostname for k in kills})}
    detect = detect or [math.nan]
    p50, p90, worst = (statistics.median(resumes), _pct(resumes, 90), max(resumes)) if resumes else (math.nan,) * 3
    print(
        f"\nSOAK: {len(jobs)} jobs on {GPUS} simulated GPUs, {len(kills)} kills (kill -9 of a random GPU worker), "
        f"{len(hits)} hit a running job; lost {len(lost)}, run twice {len(twice)}; "
        f"time to resume p50 {p50:.2f} s, max {worst:.2f} s (p90 {p90:.2f} s); wall {run.wall_s:.0f} s"
    )
    print(
        f"SOAK detail: kill to reap p50 {statistics.median(detect):.2f} s, max {max(detect):.2f} s "
        f"(lease {LEASE_S} s, reaper every 0.5 s); GPU workers up: mean {statistics.mean(run.ready_counts):.1f}, "
        f"min {min(run.ready_counts)} of {GPUS}; slices {sum(map(len, slices.values()))}, "
        f"lost slices {lost_slices} ({len(unexplained)} not from a kill), rolled back {len(rolled_back)} "
        f"({sum(s.steps for s in rolled_back)} steps run again), reaped {maintenance.reaped}, "
        f"re-dispatched {maintenance.redispatched}, kills per worker {kills_per_worker}"
    )
    for s in unexplained:
        near = [f"{(k.at - s.ended_at).total_seconds():+.3f}" for k in kills if k.hostname == s.worker]
        print(
            f"SOAK lost slice not from a kill: job {s.job_id} on {s.worker}, {s.started_at:%H:%M:%S.%f} to "
            f"{s.ended_at:%H:%M:%S.%f}; kills of that worker, s from the slice's end: {near}"
        )


def test_kill_9_of_random_gpu_workers_loses_no_job_and_runs_none_twice(start_workers, alice, settings):
    settings.CLOCKQ_LEASE_S = LEASE_S
    settings.CLOCKQ_REDISPATCH_GRACE_S = 1.0
    workers = start_workers(
        gpus=GPUS,
        CLOCKQ_LEASE_S=str(LEASE_S),
        CLOCKQ_CHECKPOINT_EVERY_S="0.001",  # every recorded slice is checkpointed
        CLOCKQ_REDISPATCH_GRACE_S="1",
        CLOCKQ_LOG_LEVEL="WARNING",
    )
    maintenance = Maintenance()
    maintenance.start()
    try:
        run = _submit_and_kill(workers, alice)
    finally:
        maintenance.stop()

    ids = run.ids
    jobs = {job.pk: job for job in Job.objects.filter(pk__in=ids)}
    slices: dict[int, list[Slice]] = {pk: [] for pk in ids}
    for s in Slice.objects.filter(job_id__in=ids).order_by("started_at", "id"):
        slices[s.job_id].append(s)

    lost = sorted(pk for pk, job in jobs.items() if job.state != "succeeded")
    overlapping = sorted(pk for pk, rows in slices.items() if _overlap(rows))
    kept_steps = {pk: sum(s.steps for s in rows if not s.rolled_back) for pk, rows in slices.items()}
    too_many_steps = sorted(pk for pk, steps in kept_steps.items() if steps > jobs[pk].params["steps"])
    twice = sorted({*overlapping, *too_many_steps})
    too_few_steps = sorted(pk for pk, steps in kept_steps.items() if steps < jobs[pk].params["steps"])
    charged = sorted(pk for pk, job in jobs.items() if job.failures or any(s.outcome == "failed" for s in slices[pk]))
    detect, unexplained = _match_kills(run.kills, slices, ids)
    _print_report(run, jobs, slices, detect, unexplained, maintenance, lost, twice)

    hits = [k for k in run.kills if k.job_id is not None]
    assert not maintenance.errors, maintenance.errors[:5]
    assert len(run.kills) == KILLS
    assert lost == [], f"jobs lost: {[(pk, jobs[pk].state, jobs[pk].last_error[-300:]) for pk in lost[:10]]}"
    assert twice == [], f"jobs run twice: overlapping slices {overlapping[:10]}, too many steps {too_many_steps[:10]}"
    assert too_few_steps == [], f"jobs that succeeded with fewer recorded steps than they have: {too_few_steps[:10]}"
    assert charged == [], f"jobs charged a failure for a kill: {charged[:10]}"
    assert all(k.resumed_after_s is not None for k in hits), "every job taken back ran again"
