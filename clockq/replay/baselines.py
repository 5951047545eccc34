"""The policies clockq is measured against.

- `fifo`: one queue in submission order; a job runs to completion. The status quo the
  specification replaced.
- `priority`: what plain Celery with five queues gives: strict tier order, no preemption, no
  slicing, no promotion.
- `las`: discretised least-attained-service from Tiresias (Gu et al., NSDI '19). Jobs move down
  through queues as the GPU-time they have received (GPUs x seconds) crosses each threshold;
  a more urgent queue preempts a less urgent one; within a queue, the earliest submitted job
  goes first. Its starvation knob: a job that has waited `knob` times as long as it last ran
  goes back to the first queue. It needs no tiers, only what a job has received.

These are reference policies, written here: they are not clockq's, so they do not come from
clockq/policy. They share the engine's accounting, dispatch and job-level rules (deadlines and
start timeouts) with the clockq replay.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque

from clockq.replay.config import Config
from clockq.replay.engine import EPS, Ev, Replay, SimJob, St, next_grid
from clockq.replay.model import Trace

_SERVICE_EPS = 1e-6  # GPU-seconds


class FifoReplay(Replay):
    name = "fifo"

    def __init__(self, trace: Trace, config: Config):
        super().__init__(trace, config)
        self.queue: deque[tuple[SimJob, int]] = deque()

    def enqueue(self, job: SimJob) -> None:
        self.queue.append((job, job.qseq))

    def head(self) -> SimJob | None:
        queue = self.queue
        while queue:
            job, seq = queue[0]
            if job.qseq == seq and job.state == St.WAITING:
                return job
            queue.popleft()  # timed out while waiting
        return None

    def pop_head(self) -> SimJob:
        return self.queue.popleft()[0]


class PriorityReplay(Replay):
    name = "priority"

    def __init__(self, trace: Trace, config: Config):
        super().__init__(trace, config)
        self.queues: list[deque[tuple[SimJob, int]]] = [deque() for _ in range(max(self.tier_by_rank) + 1)]
        self._head_rank = 0

    def enqueue(self, job: SimJob) -> None:
        self.queues[job.rank].append((job, job.qseq))

    def head(self) -> SimJob | None:
        for rank, queue in enumerate(self.queues):
            while queue:
                job, seq = queue[0]
                if job.qseq == seq and job.state == St.WAITING:
                    self._head_rank = rank
                    return job
                queue.popleft()
                self.dropped_stale(rank)
        return None

    def pop_head(self) -> SimJob:
        return self.queues[self._head_rank].popleft()[0]

    def dropped_stale(self, rank: int) -> None:
        """The entry of a job that left the queue from the middle reached the head and went."""


class LasReplay(Replay):
    name = "las"
    _STARVATION_CHECK = 1

    def __init__(self, trace: Trace, config: Config):
        super().__init__(trace, config)
        self.thresholds = list(config.las_thresholds_gpu_s)
        levels = len(self.thresholds) + 1
        # Per level: a heap of (submit time, index, queue seq); stale entries are skipped.
        self.queues: list[list[tuple[float, int, int]]] = [[] for _ in range(levels)]
        self.running_at: list[dict[int, SimJob]] = [{} for _ in range(levels)]
        self._head_level = 0
        self._rebalancing = False
        self._check_scheduled = False

    def level_of(self, job: SimJob) -> int:
        # A micro-GPU-second over: a job timed to reach a threshold can arrive a float hair
        # short of it, and would be timed to reach it again at the same instant, forever.
        return bisect.bisect_right(self.thresholds, job.attained - job.level_base + _SERVICE_EPS)

    # --- the queues ---------------------------------------------------------------------------

    def enqueue(self, job: SimJob) -> None:
        job.level = self.level_of(job)
        heapq.heappush(self.queues[job.level], (job.t.submit_s, job.idx, job.qseq))
        if job.level > 0 and not self._check_scheduled:
            self._check_scheduled = True
            self.schedule(next_grid(self.now, self.cfg.las_check_s), Ev.TICK, tag=self._STARVATION_CHECK)

    def head(self) -> SimJob | None:
        for level, queue in enumerate(self.queues):
            while queue:
                _, idx, seq = queue[0]
                job = self.jobs[idx]
                if job.qseq == seq and job.state == St.WAITING:
                    self._head_level = level
                    return job
                heapq.heappop(queue)
        return None

    def pop_head(self) -> SimJob:
        return self.jobs[heapq.heappop(self.queues[self._head_level])[1]]

    # --- running ------------------------------------------------------------------------------

    def began(self, job: SimJob) -> None:
        job.level = self.level_of(job)
        job.last_exec_s = 0.0
        self.running_at[job.level][job.idx] = job
        self.run_alone(job)
        self._schedule_demotion(job)

    def _schedule_demotion(self, job: SimJob) -> None:
        if job.level < len(self.thresholds):
            to_go = (self.thresholds[job.level] - (job.attained - job.level_base)) / job.t.num_gpu
            if to_go < job.remaining - EPS:
                self.schedule(self.now + max(to_go, 0.0), Ev.BOUNDARY, job)

    def boundary(self, job: SimJob) -> None:
        """It crossed a threshold: one queue down, and maybe preempted by a waiting job."""
        self.account(job)
        del self.running_at[job.level][job.idx]
        job.level = self.level_of(job)
        self.running_at[job.level][job.idx] = job
        self._schedule_demotion(job)
        self.rebalance()

    def stopped(self, job: SimJob) -> None:
        self.running_at[job.level].pop(job.idx, None)

    def started_waiting(self, job: SimJob) -> None:
        self.rebalance()

    def rebalance(self) -> None:
        """Preempt the least urgent running jobs while the most urgent waiting job is in a more
        urgent queue than they are and lacks GPUs."""
        if self._rebalancing:
            return  # a preemption below re-queued its victim; the loop here carries on
        self._rebalancing = True
        try:
            while (waiting := self.head()) is not None:
                if waiting.t.num_gpu <= self.free + self.freeing:
                    return  # GPUs are free or on their way to it
                victim = self._least_urgent_running(below=waiting.level)
                if victim is None:
                    return
                self.account(victim)
                if victim.remaining <= EPS:
                    self.finish(victim)
                else:
                    self.leave_gpus(victim, cost_s=victim.switch_s)
        finally:
            self._rebalancing = False

    def _least_urgent_running(self, below: int) -> SimJob | None:
        for level in range(len(self.running_at) - 1, below, -1):
            if self.running_at[level]:
                return self.running_at[level][next(reversed(self.running_at[level]))]  # the latest started
        return None

    # --- the starvation knob -------------------------------------------------------------------

    def tick(self, kind: int) -> None:
        promoted = False
        waiting = False
        for level in range(1, len(self.queues)):
            for _, idx, seq in list(self.queues[level]):
                job = self.jobs[idx]
                if job.qseq != seq or job.state != St.WAITING:
                    continue
                if self.now - job.waiting_since >= self.cfg.las_starve_knob * job.last_exec_s:
                    job.level_base = job.attained  # back to the first queue
                    job.qseq += 1
                    self.enqueue(job)
                    promoted = True
                else:
                    waiting = True
        self._check_scheduled = waiting
        if waiting:
            self.schedule(self.now + self.cfg.las_check_s, Ev.TICK, tag=self._STARVATION_CHECK)
        if promoted:
            self.dispatch()
            self.rebalance()
