"""The discrete-event core that every replayed policy shares.

Time is the trace's seconds. GPUs are interchangeable: a job holds `num_gpu` of them at once (a
gang) and gives them all back together. The engine keeps the accounting every policy needs:
arrivals, starts, finishes, deadlines and start timeouts (the same job-level rules for every
policy, judged by clockq/policy/service_levels.py), switch costs, and the GPU-time spent
computing and switching. A policy subclass decides who waits where, who starts next, and what
happens while a job runs.

Dispatch is strict: jobs start in the policy's order, and a job that does not fit in the free
GPUs blocks the ones behind it (no backfilling), so a gang of 8 is never starved by a stream of
single-GPU jobs. Every policy dispatches this way, so their rows compare directly.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from enum import IntEnum
from typing import Any

from clockq.policy import control, service_levels
from clockq.replay.admission import Admission
from clockq.replay.config import Config
from clockq.replay.ledger import Ledger
from clockq.replay.model import JobResult, RunResult, Trace, TraceJob

EPS = 1e-9  # seconds of work below which a job is done (float arithmetic)


class St(IntEnum):
    PENDING = 0  # not submitted yet
    WAITING = 1
    RUNNING = 2
    DONE = 3
    HELD = 4  # arrived while admission was closed: not queued yet


class Ev(IntEnum):
    FREE = 0  # GPUs come back after a switch (first: they let waiting jobs start)
    FINISH = 1  # a running job's work is done (it ran alone, at full rate)
    BOUNDARY = 2  # a running job's slice ends
    DEADLINE = 3
    START_TIMEOUT = 4
    TICK = 5  # a periodic task of the policy (promotion tick, batch chance, LAS check)
    FORECAST = 6  # admission control's load sample and forecast


class SimJob:
    """A job's state during one replay."""

    __slots__ = (
        "attained",
        "finish",
        "first_start",
        "got_gpus_at",
        "home_rank",
        "idx",
        "last_exec_s",
        "level",
        "level_base",
        "level_from",
        "mode",
        "preemptions",
        "promoted_at",
        "promoted_gpus",
        "promotions",
        "qseq",
        "rank",
        "rate",
        "remaining",
        "run_since",
        "skipped_rounds",
        "slice_rank",
        "slice_s",
        "standing",
        "state",
        "switch_s",
        "t",
        "timed_out",
        "version",
        "vseq",
        "waiting_since",
    )

    def __init__(self, t: TraceJob, idx: int, rank: int, switch_s: float):
        self.t, self.idx = t, idx
        self.state = St.PENDING
        self.rank = self.home_rank = rank
        self.remaining = t.duration_s
        self.switch_s = switch_s
        self.slice_s = 0.0  # the live slice length planned for it (clockq) ...
        self.slice_rank = -1  # ... in the tier of this rank
        self.run_since = 0.0
        self.rate = 1.0  # work per second of holding its GPUs (below 1 while time-sharing)
        self.version = 0  # bumped whenever its scheduled event is no longer valid
        self.vseq = 0  # bumped whenever its entry among the running (as a victim) is no longer valid
        self.qseq = 0  # bumped at each enqueue; queue entries with an older one are stale
        self.waiting_since = 0.0
        self.first_start: float | None = None
        self.finish: float | None = None
        self.timed_out = False
        self.preemptions = self.promotions = self.skipped_rounds = 0
        self.got_gpus_at = 0.0  # when it last got its GPUs (clockq: its minimum run)
        self.mode = 0  # policy-defined
        self.promoted_gpus = 0  # policy-defined (clockq: its GPUs in promoted jobs' share)
        self.standing: Any = None  # policy-defined: clockq's standing while it waits
        self.level = 0  # LAS queue
        self.attained = 0.0  # GPU-seconds of service (LAS)
        self.level_base = 0.0  # attained service when it last (re)entered level 0 (LAS starvation)
        self.promoted_at = 0.0  # attained service when it was last promoted (clockq)
        self.level_from = 0.0  # attained service its level counts from (clockq: a batch chance)
        self.last_exec_s = 0.0  # length of its last run (LAS starvation knob)


class Replay:
    """The shared engine. Subclasses implement the queue and what happens while jobs run."""

    name = ""

    def __init__(self, trace: Trace, config: Config):
        self.cfg = config
        self.tiers = list(config.tiers)
        self.tier_by_code = {t.code: t for t in self.tiers}
        self.tier_by_rank = {t.rank: t for t in self.tiers}
        self.jobs = [
            SimJob(j, i, self.tier_by_code[j.tier].rank, config.switch_cost.ms(j.checkpoint_mb) / 1000.0)
            for i, j in enumerate(trace.jobs)
        ]
        self.free = config.gpus
        self.freeing = 0  # GPUs that come back when a switch in progress ends
        self.now = 0.0
        self._heap: list[tuple[float, int, int, SimJob | None, int]] = []
        self._seq = itertools.count()
        self.running: dict[int, SimJob] = {}
        submits = [j.submit_s for j in trace.jobs] or [0.0]
        self.ledger = Ledger(config.gpus, window_start=min(submits), window_end=max(submits))
        self.start_order: list[str] = []
        self.events = 0
        self.done = 0
        self.waiting_count = 0
        self.waiting_gpus = 0  # the GPUs waiting jobs ask for (the load index's demand)
        self.admission: Admission[SimJob] | None = (
            Admission(config.admission, config.forecast_every_s) if config.admission is not None else None
        )
        self._arrivals_left = len(self.jobs)
        self._forecasting = False

    # --- what a policy implements ------------------------------------------------------------

    def enqueue(self, job: SimJob) -> None:
        raise NotImplementedError

    def head(self) -> SimJob | None:
        """The next job in dispatch order, without taking it (stale entries may be dropped)."""
        raise NotImplementedError

    def pop_head(self) -> SimJob:
        raise NotImplementedError

    def began(self, job: SimJob) -> None:
        """The job just got its GPUs: schedule what happens next (its finish or a boundary)."""
        self.run_alone(job)

    def work_done(self, job: SimJob) -> None:
        """A job that ran alone has done all its work."""
        self.finish(job)

    def boundary(self, job: SimJob) -> None:
        raise NotImplementedError(f"{self.name} has no slice boundaries")

    def tick(self, kind: int) -> None:
        raise NotImplementedError(f"{self.name} has no periodic tasks")

    def started_waiting(self, job: SimJob) -> None:
        """A job joined the queue and did not start at once (a preemptive policy acts here)."""

    def left_queue(self, job: SimJob) -> None:
        """A waiting job timed out and left its queue."""

    def stopped(self, job: SimJob) -> None:
        """A running job left its GPUs (finished, timed out or preempted)."""

    # --- events -------------------------------------------------------------------------------

    def schedule(self, at: float, kind: Ev, job: SimJob | None = None, tag: int = 0) -> None:
        version = job.version if job is not None else tag
        heapq.heappush(self._heap, (at, next(self._seq), int(kind), job, version))

    def run(self) -> RunResult:
        started = time.perf_counter()
        arrivals = self.jobs
        next_arrival = 0
        next_report = started + self.cfg.progress_every_s
        heap = self._heap
        while next_arrival < len(arrivals) or heap:
            if next_arrival < len(arrivals) and (not heap or arrivals[next_arrival].t.submit_s <= heap[0][0]):
                job = arrivals[next_arrival]
                next_arrival += 1
                self._arrivals_left -= 1
                self._advance(job.t.submit_s)
                self.events += 1
                self._arrive(job)
            else:
                at, _, kind, job_or_none, version = heapq.heappop(heap)
                self._advance(at)
                self.events += 1
                self._handle(kind, job_or_none, version)
            if self.cfg.progress and self.events % 4096 == 0 and time.perf_counter() >= next_report:
                next_report = time.perf_counter() + self.cfg.progress_every_s
                self.cfg.progress(self._progress(started))
        wall = time.perf_counter() - started
        if self.cfg.progress:
            self.cfg.progress(self._progress(started))
        return self._result(wall)

    def _advance(self, to: float) -> None:
        """Move the clock; count how many GPUs running jobs held meanwhile, and whether work
        waited (a scheduler that keeps GPUs free while work waits wastes them)."""
        held = self.cfg.gpus - self.free - self.freeing
        self.ledger.elapse(self.now, to, held_gpus=held, jobs_wait=self.waiting_count > 0)
        self.now = to

    def _handle(self, kind: int, job: SimJob | None, version: int) -> None:
        if kind == Ev.FREE:
            self.freeing -= version
            self.free += version
            self.dispatch()
            return
        if kind == Ev.TICK:
            self.tick(version)
            return
        if kind == Ev.FORECAST:
            self._forecast()
            return
        assert job is not None
        if kind == Ev.DEADLINE:
            self._deadline(job)
        elif kind == Ev.START_TIMEOUT:
            self._start_timeout(job)
        elif job.version != version or job.state != St.RUNNING:
            return  # superseded: the job was preempted, timed out or rescheduled meanwhile
        elif kind == Ev.FINISH:
            self.account(job)
            self.work_done(job)
        elif kind == Ev.BOUNDARY:
            self.boundary(job)

    def _arrive(self, job: SimJob) -> None:
        tier = self.tier_by_rank[job.rank]
        if job.t.deadline_s is not None:
            self.schedule(max(job.t.deadline_s, self.now), Ev.DEADLINE, job)
        if tier.start_timeout_ms is not None:
            self.schedule(self.now + tier.start_timeout_ms / 1000.0, Ev.START_TIMEOUT, job)
        if self.admission is not None:
            if not self._forecasting:  # the first arrival starts the loop, on beat's grid
                self._forecasting = True
                self.schedule(next_grid(self.now, self.admission.every_s), Ev.FORECAST)
            if not self._admitted(job):
                job.state = St.HELD
                self.admission.hold(job, job.home_rank)
                return
        self.wait(job)

    def _forecast(self) -> None:
        """Admission control's minute: sample, decide, queue the held jobs it now admits; again
        while jobs may still arrive or are held."""
        assert self.admission is not None
        busy = self.cfg.gpus - self.free - self.freeing
        self.admission.decide(self.now, busy_gpus=busy, waiting_gpus=self.waiting_gpus, gpus=self.cfg.gpus)
        # Asked by tier, then by age, as the live release asks them: each one queued changes
        # the room of those after it.
        for rank in sorted(self.admission.held):
            code = self.tier_by_rank[rank].code
            if not self.admission.weighs_room(code) and not self.admission.admits(code, None):
                continue  # none of this tier is admitted now, whatever the room
            for job in self.admission.take_held(rank):
                if job.state != St.HELD:
                    continue  # timed out while held
                if self._admitted(job):
                    self.wait(job)
                else:
                    self.admission.keep_holding(job, rank)
        if self._arrivals_left or self.admission.holds_any():
            self.schedule(self.now + self.admission.every_s, Ev.FORECAST)

    def _admitted(self, job: SimJob) -> bool:
        """`control.admits` for a new or held job, with the room it would find (read only when
        the rule weighs it, and the work ahead only while no GPU is free: `Room.full`)."""
        assert self.admission is not None
        tier = self.tier_by_rank[job.home_rank]
        room = None
        if self.admission.weighs_room(tier.code):
            free = self.free + self.freeing  # GPUs coming back from a switch are as good as free
            ahead = self.gpus_ahead_of_new(job.home_rank) if free <= 0 else 0
            room = control.Room(self.cfg.gpus, free, ahead)
        return self.admission.admits(tier.code, room)

    def gpus_ahead_of_new(self, rank: int) -> int:
        """For admission: the GPUs that waiting work the policy starts before a new job of tier
        `rank` asks for (`control.gpus_ahead`). Here every waiting job, as under FIFO; a policy
        with another order says so."""
        return self.waiting_gpus

    def wait(self, job: SimJob, *, keep_since: bool = False) -> None:
        """Into the queue (a new job, or one that yielded its GPUs)."""
        job.state = St.WAITING
        job.qseq += 1
        if not keep_since:
            job.waiting_since = self.now
        self.waiting_count += 1
        self.waiting_gpus += job.t.num_gpu
        self.enqueue(job)
        self.dispatch()
        if job.state == St.WAITING:
            self.started_waiting(job)

    def dispatch(self) -> None:
        """Start jobs in order while the next one fits in the free GPUs."""
        while self.free > 0:
            job = self.head()
            if job is None or job.t.num_gpu > self.free:
                return
            self.pop_head()
            self.waiting_count -= 1
            self.waiting_gpus -= job.t.num_gpu
            self._start(job)

    def _start(self, job: SimJob) -> None:
        if job.first_start is None:
            # The claim judges the first start against the tier's start timeout, as the live
            # workers do: a job claimed too late is worthless and ends at once.
            tier = self.tier_by_rank[job.home_rank]
            waited_ms = (self.now - job.t.submit_s) * 1000.0
            verdict = service_levels.judge_wait(
                waited_ms, target_ms=tier.wait_target_ms, start_timeout_ms=tier.start_timeout_ms
            )
            if verdict == service_levels.WaitVerdict.TIMED_OUT:
                self._time_out(job)
                return
            job.first_start = self.now
            self.start_order.append(job.t.key)
        self.free -= job.t.num_gpu
        job.state = St.RUNNING
        job.version += 1
        job.run_since = self.now
        job.rate = 1.0
        self.running[job.idx] = job
        self.began(job)

    # --- running jobs -----------------------------------------------------------------------

    def run_alone(self, job: SimJob) -> None:
        """Nothing to make way for: it runs at full rate until done. No events on the way."""
        job.rate = 1.0
        self.schedule(self.now + job.remaining, Ev.FINISH, job)

    def account(self, job: SimJob) -> None:
        """Credit the work done since `run_since` at the job's rate; the rest of the time its
        GPUs were switching (time-sharing overhead)."""
        held = self.now - job.run_since
        if held > 0:
            gpus = job.t.num_gpu
            work = held * job.rate
            job.remaining -= work
            job.attained += work * gpus
            self.ledger.busy_gpu_s += work * gpus
            self.ledger.switch_gpu_s += (held - work) * gpus
            job.last_exec_s += held
        job.run_since = self.now

    def finish(self, job: SimJob) -> None:
        self._release(job, cost_s=0.0)
        job.finish = self.now
        job.state = St.DONE
        self.done += 1
        self.dispatch()

    def leave_gpus(self, job: SimJob, *, cost_s: float) -> None:
        """Preempted or yielded: its GPUs come back after the switch, and it waits again."""
        self._release(job, cost_s=cost_s)
        job.preemptions += 1
        self.wait(job)

    def _release(self, job: SimJob, *, cost_s: float) -> None:
        del self.running[job.idx]
        job.version += 1
        gpus = job.t.num_gpu
        self.stopped(job)
        if cost_s > 0:
            self.ledger.switch_gpu_s += cost_s * gpus
            self.freeing += gpus
            self.schedule(self.now + cost_s, Ev.FREE, tag=gpus)
        else:
            self.free += gpus

    # --- job-level rules, the same under every policy ----------------------------------------

    def _deadline(self, job: SimJob) -> None:
        if job.state == St.HELD:
            self._time_out(job)  # it stays in the held list, which skips it
        elif job.state == St.WAITING:
            self.waiting_count -= 1
            self.waiting_gpus -= job.t.num_gpu
            self.left_queue(job)
            self._time_out(job)
        elif job.state == St.RUNNING:
            self.account(job)
            if job.remaining <= EPS:
                self.finish(job)
            else:
                self.deadline_while_running(job)

    def deadline_while_running(self, job: SimJob) -> None:
        """A job past its deadline is worthless: it stops and times out."""
        self._release(job, cost_s=0.0)
        self._time_out(job)
        self.dispatch()

    def _start_timeout(self, job: SimJob) -> None:
        if job.state != St.WAITING or job.first_start is not None:
            return
        tier = self.tier_by_rank[job.home_rank]
        waited_ms = (self.now - job.t.submit_s) * 1000.0
        verdict = service_levels.judge_wait(
            waited_ms + 1e-6, target_ms=tier.wait_target_ms, start_timeout_ms=tier.start_timeout_ms
        )
        if verdict == service_levels.WaitVerdict.TIMED_OUT:
            self.waiting_count -= 1
            self.waiting_gpus -= job.t.num_gpu
            self.left_queue(job)
            self._time_out(job)

    def _time_out(self, job: SimJob) -> None:
        job.state = St.DONE
        job.timed_out = True
        job.finish = self.now
        job.version += 1
        job.qseq += 1  # any queue entry of it is stale now
        self.done += 1

    # --- results ------------------------------------------------------------------------------

    def _progress(self, started: float) -> dict:
        wall = max(time.perf_counter() - started, 1e-9)
        return {
            "policy": self.name,
            "jobs_done": self.done,
            "jobs": len(self.jobs),
            "sim_time_s": self.now,
            "events": self.events,
            "events_per_s": self.events / wall,
        }

    def _result(self, wall: float) -> RunResult:
        unfinished = [j.t.key for j in self.jobs if j.state != St.DONE]
        if unfinished:  # an engine bug, never a silently wrong table
            raise RuntimeError(f"{self.name}: {len(unfinished)} job(s) never ended, e.g. {unfinished[:3]}")
        results = [
            JobResult(
                job=j.t,
                first_start_s=j.first_start,
                finish_s=j.finish,
                timed_out=j.timed_out,
                preemptions=j.preemptions,
                promotions=j.promotions,
            )
            for j in self.jobs
        ]
        return RunResult(
            policy=self.name,
            gpus=self.cfg.gpus,
            jobs=results,
            busy_gpu_s=self.ledger.busy_gpu_s,
            switch_gpu_s=self.ledger.switch_gpu_s,
            waiting_s=self.ledger.waiting_s,
            held_while_waiting_gpu_s=self.ledger.held_while_waiting_gpu_s,
            window_s=self.ledger.window_s,
            window_held_gpu_s=self.ledger.window_held_gpu_s,
            held_jobs=self.admission.stats.held_jobs if self.admission else 0,
            admission_closures=self.admission.stats.closures if self.admission else 0,
            start_order=self.start_order,
            events=self.events,
            wall_s=wall,
        )


def next_grid(now: float, every: float) -> float:
    """The next time on a fixed grid of `every` seconds strictly after `now` (beat's schedule)."""
    return (math.floor(now / every) + 1) * every
