"""clockq's policy, replayed: every decision comes from clockq/policy, the code the live workers
and beat run.

- **Order.** Five queues drained in tier order, first in first out within a tier (Celery's
  priority strategy over the tier queues). A job that yields goes to the back of its queue.
- **Slices.** `plan_slice` gives the live slice length S from the tier, the job's utilisation (where
  the trace tells it) and its switch cost C. At each boundary `decide_at_boundary` finishes,
  continues or yields, as in workers/slice_runner.py.
- **Trace scale.** Live slices last milliseconds and traces days, so:
  - a job with nothing to make way for runs on with no events until it finishes, as the live
    worker continues slice after slice without switching;
  - when a job starts waiting in the same or a more urgent tier, each such running job gets a
    boundary one live slice S later, as it would live, and pays one switch C if it yields;
  - jobs that take turns do so in slices of `quantum` (at least S). Such a slice stands for
    quantum / (S + C) live slices, so the job does S / (S + C) of a second's work per second:
    the switching overhead of live time-sharing, without simulating every slice. As the quantum
    shrinks, this converges to the live round robin (README, "Trace replay").
- **RT preemption.** An RT job without free GPUs cuts short a running lower-tier job (the
  live interrupt; which busy GPU takes it is random, as it is live), which yields after paying
  its switch C: the RT job starts then.
- **Starvation control.** The promotion tick and batch chances run on beat's schedule and call
  `decide_round` and `batch_chance`. A promoted job runs one live slice in the higher tier and is
  decided as a job of its own tier at that boundary, as the live worker returns it home.
"""

from __future__ import annotations

import random
from collections import deque
from enum import IntEnum

from clockq.policy import promotion, slicing
from clockq.replay.baselines import PriorityReplay
from clockq.replay.engine import EPS, Config, Ev, SimJob, St, next_grid
from clockq.replay.model import Trace


class Mode(IntEnum):
    ALONE = 0  # nothing to make way for: runs on, no events until it finishes
    TAIL = 1  # someone started waiting: its current live slice ends, then it decides
    TURNS = 2  # taking turns: a quantum at the time-sharing rate, then it decides
    PROMOTED = 3  # one live slice in a more urgent tier, then home


_PROMOTION_TICK = 1
_BATCH_CHANCE = 2


class ClockqReplay(PriorityReplay):
    """Plain priority's five queues (Celery's), plus slices, preemption and promotion."""

    name = "clockq"

    def __init__(self, trace: Trace, config: Config):
        super().__init__(trace, config)
        ranks = len(self.queues)
        self.stale = [0] * ranks  # entries of jobs that left a queue other than by its head
        self.waiting_by_rank = [0] * ranks  # what the worker reads from the broker
        self.rt_demand = 0  # GPUs wanted by waiting jobs of rank 0
        self.alone: list[dict[int, SimJob]] = [{} for _ in range(ranks)]
        self.victims: list[SimJob] = []  # running jobs an RT job may cut short (rank > 0)
        self.victim_pos: dict[int, int] = {}
        self.rng = random.Random(config.seed)
        self.tick_s = config.promotion_tick_s
        self.chance_every_s = config.batch_chance_every_s
        self.rules = {t.code: promotion.TierRule(t.code, t.promote_after_rounds, t.promote_to) for t in self.tiers}
        self.promotable = [t.rank for t in self.tiers if t.promote_after_rounds and t.promote_to]
        self.chance_tiers = [t for t in self.tiers if t.chance_jobs and t.chance_to]
        self._ticking = {_PROMOTION_TICK: False, _BATCH_CHANCE: False}
        self.slices_started = 0  # since the last promotion tick
        self.started_since_tick: set[int] = set()

    # --- the five queues ----------------------------------------------------------------------

    def enqueue(self, job: SimJob) -> None:
        super().enqueue(job)
        self._counted(job, +1)
        if job.rank == job.home_rank:
            if job.rank in self.promotable:
                self._keep_ticking(_PROMOTION_TICK, self.tick_s)
            if any(t.rank == job.rank for t in self.chance_tiers):
                self._keep_ticking(_BATCH_CHANCE, self.chance_every_s)

    def _counted(self, job: SimJob, delta: int) -> None:
        self.waiting_by_rank[job.rank] += delta
        if job.rank == 0:
            self.rt_demand += delta * job.t.num_gpu

    def dropped_stale(self, rank: int) -> None:
        self.stale[rank] = max(self.stale[rank] - 1, 0)

    def pop_head(self) -> SimJob:
        job = super().pop_head()
        self._counted(job, -1)
        return job

    def left_queue(self, job: SimJob) -> None:
        self._counted(job, -1)
        self._left_behind(job.rank)

    def _left_behind(self, rank: int) -> None:
        """A job left this queue from the middle (timed out, promoted): its entry stays until
        it reaches the head. A starved queue's head never moves, so compact it now and then."""
        self.stale[rank] += 1
        queue = self.queues[rank]
        if self.stale[rank] > 64 and self.stale[rank] * 2 > len(queue):
            self.queues[rank] = deque((j, seq) for j, seq in queue if j.qseq == seq and j.state == St.WAITING)
            self.stale[rank] = 0

    # --- running ------------------------------------------------------------------------------

    def began(self, job: SimJob) -> None:
        if job.slice_rank != job.rank:
            # The live worker plans every slice; with a replayed job's utilisation and switch
            # cost fixed, the plan only changes with the tier, so it is kept until then.
            tier = self.tier_by_rank[job.rank]
            plan = slicing.plan_slice(
                base_ms=tier.base_slice_ms,
                min_ms=tier.min_slice_ms,
                avg_util=job.t.avg_util,
                switch_cost_ms=job.switch_s * 1000.0,
                overhead_budget=self.cfg.overhead_budget,
                max_ms=self.cfg.max_slice_ms,
            )
            job.slice_s, job.slice_rank = plan.ms / 1000.0, job.rank
        job.skipped_rounds = 0  # starting a slice restarts its streak, as leaving the queue does live
        self.slices_started += 1
        self.started_since_tick.add(job.idx)
        if job.rank > 0:
            self.victim_pos[job.idx] = len(self.victims)
            self.victims.append(job)
        if job.rank != job.home_rank:
            job.mode = Mode.PROMOTED
            self._boundary_in(job, job.slice_s, rate=1.0)
        else:
            self._next_slice(job)

    def _next_slice(self, job: SimJob) -> None:
        if slicing.waiting_ahead(job.rank, self.waiting_by_rank):
            job.mode = Mode.TURNS
            slice_s = max(self.cfg.quantum_s, job.slice_s)
            self._boundary_in(job, slice_s, rate=job.slice_s / (job.slice_s + job.switch_s))
        else:
            job.mode = Mode.ALONE
            self.alone[job.rank][job.idx] = job
            self.run_alone(job)

    def _boundary_in(self, job: SimJob, slice_s: float, rate: float) -> None:
        job.rate = rate
        job.version += 1  # any FINISH planned while it ran alone is void
        self.schedule(self.now + min(slice_s, job.remaining / rate), Ev.BOUNDARY, job)

    def stopped(self, job: SimJob) -> None:
        self.alone[job.rank].pop(job.idx, None)
        pos = self.victim_pos.pop(job.idx, None)
        if pos is not None:  # swap-remove, so a random victim stays O(1)
            last = self.victims.pop()
            if last is not job:
                self.victims[pos] = last
                self.victim_pos[last.idx] = pos

    def work_done(self, job: SimJob) -> None:
        self._decide(job, slicing.Boundary(done=True, job_rank=job.rank, waiting_by_rank=[]))

    def boundary(self, job: SimJob) -> None:
        self.account(job)
        if job.rank != job.home_rank:
            # The live worker returns a promoted job home at its first boundary, and decides
            # as a job of its own tier from there.
            job.rank = job.home_rank
        done = job.remaining <= EPS
        waiting = [] if done else self.waiting_by_rank
        self._decide(job, slicing.Boundary(done=done, job_rank=job.rank, waiting_by_rank=waiting))

    def deadline_while_running(self, job: SimJob) -> None:
        waiting = self.waiting_by_rank
        self._decide(job, slicing.Boundary(done=False, job_rank=job.rank, waiting_by_rank=waiting, past_deadline=True))

    def _decide(self, job: SimJob, boundary: slicing.Boundary) -> None:
        action = slicing.decide_at_boundary(boundary).action
        if action == slicing.BoundaryAction.FINISH:
            self.finish(job)
        elif action == slicing.BoundaryAction.CONTINUE:
            self.alone[job.rank].pop(job.idx, None)
            self._next_slice(job)
        elif action == slicing.BoundaryAction.YIELD:
            # Taking turns already paid its switches in its rate; any other yield is one switch.
            self.leave_gpus(job, cost_s=0.0 if job.mode == Mode.TURNS else job.switch_s)
        elif action == slicing.BoundaryAction.TIME_OUT:
            super().deadline_while_running(job)
        else:  # HOLD: no operator in a replay
            raise AssertionError(f"unexpected boundary action {action}")

    def started_waiting(self, job: SimJob) -> None:
        """A job waits: running jobs it should not wait behind make way for it."""
        if job.rank == 0:
            self._cut_short_for_rt()
            return
        self._end_alone_runs(from_rank=job.rank)

    def _end_alone_runs(self, from_rank: int) -> None:
        """Every job running alone at this rank or a less urgent one reads the queue lengths at
        its next live boundary, one slice from now."""
        for rank in range(from_rank, len(self.alone)):
            alone = self.alone[rank]
            if not alone:
                continue
            for job in alone.values():
                self.account(job)
                job.mode = Mode.TAIL
                self._boundary_in(job, job.slice_s, rate=1.0)
            alone.clear()

    def _cut_short_for_rt(self) -> None:
        """The live RT interrupt: busy lower-tier GPUs end their slice at the next step, and one
        per waiting RT job (the one that takes it from the counter) makes way."""
        while self.free + self.freeing < self.rt_demand and self.victims:
            victim = self.victims[self.rng.randrange(len(self.victims))]
            self.account(victim)
            decision = slicing.decide_at_boundary(
                slicing.Boundary(
                    done=victim.remaining <= EPS,
                    job_rank=victim.rank,
                    waiting_by_rank=self.waiting_by_rank,
                    cut_short=True,
                )
            )
            if decision.action == slicing.BoundaryAction.YIELD:
                victim.mode = Mode.TAIL  # a single switch, not turns
                self.leave_gpus(victim, cost_s=victim.switch_s)
            else:
                self._decide(victim, slicing.Boundary(done=True, job_rank=victim.rank, waiting_by_rank=[]))
        if self.free + self.freeing < self.rt_demand:
            self._end_alone_runs(from_rank=0)  # only RT jobs run: RT takes turns with RT

    # --- beat's periodic tasks ----------------------------------------------------------------

    def _keep_ticking(self, kind: int, every_s: float) -> None:
        if not self._ticking[kind]:
            self._ticking[kind] = True
            self.schedule(next_grid(self.now, every_s), Ev.TICK, tag=kind)

    def tick(self, kind: int) -> None:
        if kind == _PROMOTION_TICK:
            more = self._promotion_tick()
            every = self.tick_s
        else:
            more = self._batch_chance()
            every = self.chance_every_s
        self._ticking[kind] = more
        if more:
            self.schedule(self.now + every, Ev.TICK, tag=kind)

    def _waiting_at_home(self, rank: int) -> list[SimJob]:
        return [
            job
            for job, seq in self.queues[rank]
            if job.qseq == seq and job.state == St.WAITING and job.home_rank == rank
        ]

    def _promotion_tick(self) -> bool:
        """clockq.promotion_tick: the round since the last tick, judged by decide_round."""
        facts = promotion.RoundFacts(
            started_at=self.now - self.tick_s,
            # Jobs running alone start a live slice every S without an event here.
            slices_started=self.slices_started + len(self.running),
            jobs_that_started=self.started_since_tick,
        )
        self.slices_started, self.started_since_tick = 0, set()
        waiting: list[promotion.WaitingJob[float]] = []
        for rank in self.promotable:
            code = self.tier_by_rank[rank].code
            waiting += [
                promotion.WaitingJob(job.idx, code, code, job.skipped_rounds, job.waiting_since)
                for job in self._waiting_at_home(rank)
            ]
        if not waiting:
            return False
        decisions = promotion.decide_round(facts, waiting, self.rules)
        for idx, count in decisions.skips.items():
            self.jobs[idx].skipped_rounds = count
        for p in decisions.promotions:
            self._promote(self.jobs[p.job_id], p.to_tier)
        return True

    def _batch_chance(self) -> bool:
        """clockq.batch_chance for each tier that has one: its oldest waiting jobs go up."""
        more = False
        for tier in self.chance_tiers:
            oldest = self._waiting_at_home(tier.rank)
            more = more or bool(oldest)
            waiting = [
                promotion.WaitingJob(job.idx, tier.code, tier.code, job.skipped_rounds, job.waiting_since)
                for job in oldest[: tier.chance_jobs]
            ]
            for p in promotion.batch_chance(waiting, tier=tier.code, jobs=tier.chance_jobs, to_tier=tier.chance_to):
                self._promote(self.jobs[p.job_id], p.to_tier)
        return more

    def _promote(self, job: SimJob, to_tier: str) -> None:
        """It keeps its wait and goes to the back of the more urgent queue."""
        self._counted(job, -1)
        self._left_behind(job.rank)
        job.rank = self.tier_by_code[to_tier].rank
        job.qseq += 1
        job.skipped_rounds = 0
        job.promotions += 1
        self.queues[job.rank].append((job, job.qseq))
        self._counted(job, +1)
        self.dispatch()
        if job.state == St.WAITING:
            self.started_waiting(job)
