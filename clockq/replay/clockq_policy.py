"""clockq's policy, replayed: every decision comes from clockq/policy. This module only keeps
the structures that make those decisions fast on 100,000 jobs.

- **Order** (`ordering`). One queue per tier, as Celery has (clockq/replay/tier_queue.py), and
  one per tier for the jobs promoted into it, in `ordering.order_key` order: service level,
  tier, promoted or not, the user's recent share as it is now, first submit time. A free GPU
  takes the head that `ordering.pick_next` names, which gives promoted jobs and the best-effort
  tiers their bounded shares.
- **Running.** A job runs until it finishes, crosses a rung of its tier's service ladder (its
  level drops: an event here, a boundary live), or is displaced. Nothing takes turns: the order
  changes only at rungs, arrivals and promotions, so there is no quantum to choose.
- **Making way** (`making_way.make_way`, the live boundary's composition, fed from heaps in
  `ordering.victim_key` order). When the job a free GPU would take next does not fit, the
  victim the policy names leaves when its decision says (`MakeWay.leaves_at`): once it has had
  its planned slice, or at once for RT and HP.
- **Backfill** (`ordering.may_backfill`). Behind a gang that does not fit, jobs that would make
  way for it use the free GPUs.
- **Starvation control** (`promotion`). The promotion tick and batch chances run on beat's
  schedule. A promoted job keeps its promotion until it has had the promoted tier's first rung
  of service (`Ladder.promotion_over`, which the live worker asks too), then goes home.
- **Slices** (`slicing.plan_slice`) give the planned slice a victim finishes first.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from clockq.policy import control, making_way, ordering, promotion, slicing
from clockq.replay.config import Config
from clockq.replay.engine import EPS, Ev, Replay, SimJob, St, next_grid
from clockq.replay.model import Trace
from clockq.replay.tier_queue import TierQueue
from clockq.replay.victims import Victims, Walk

_PROMOTION_TICK = 1
_BATCH_CHANCE = 2
_SERVICE_EPS = 1e-6  # GPU-seconds
BACKFILL_DEPTH = 16  # waiting jobs looked at per queue for one that fits beside a blocked gang


class ClockqReplay(Replay):
    name = "clockq"

    def __init__(self, trace: Trace, config: Config):
        super().__init__(trace, config)
        ranks = max(self.tier_by_rank) + 1
        self.ladder = config.ladder  # its tiers are the replay's ranks (Config checks)
        # One queue per tier for its own jobs, then one per tier for the jobs promoted into it
        # (their bounded share picks from those: `ordering.pick_next`); `_queue_of` says which.
        self.ranks = ranks
        self.queues = [TierQueue(self._is_queued) for _ in range(2 * ranks)]
        self._head_user = ""
        self.held_by_lower = 0  # GPUs held by jobs of the best-effort tiers (their share)
        self.victims = Victims(lambda idx, vseq: self.jobs[idx].vseq == vseq and self.jobs[idx].state == St.RUNNING)
        self.making_way = 0  # GPUs of jobs told to yield at their next boundary
        self._lower_leaving = 0  # ... of them, those in the best-effort tiers' share
        self.held_by_promoted = 0  # GPUs held by promoted jobs (their share)
        self._promoted_leaving = 0  # ... of them, those told to make way
        self.yielding: set[int] = set()
        self.user_share: dict[tuple[str, int], float] = {}  # (user, rank) -> weighted GPU-s
        self._making = False
        self.gathering_for: int | None = None  # the blocked head whose GPUs are being freed
        self._head_rank = 0
        # head() is asked several times per event; it changes only with the queues (counted
        # here), the free GPUs and the shares' holdings.
        self._queue_changes = 0
        self._share_changes = [0] * ranks  # per tier: a user's share orders its jobs, so its head may change
        self._head_memo: tuple[tuple[int, int, int, int, int], tuple[int, str], SimJob | None] | None = None
        self._backfill_found_nothing: tuple[int, int, int, int] | None = None
        self._ahead_memo: dict[int, tuple[int, int]] = {}  # rank -> (queue changes, GPUs ahead)
        self.tick_s = config.promotion_tick_s
        self.chance_every_s = config.batch_chance_every_s
        self.rules = {t.code: promotion.TierRule(t.code, t.promote_after_rounds, t.promote_to) for t in self.tiers}
        self.promotable = [t.rank for t in self.tiers if t.promote_after_rounds and t.promote_to]
        self.chance_tiers = [t for t in self.tiers if t.chance_jobs and t.chance_to]
        self._ticking = {_PROMOTION_TICK: False, _BATCH_CHANCE: False}
        self.slices_started = 0  # since the last promotion tick
        self.started_since_tick: set[int] = set()

    # --- what the order knows of a job ---------------------------------------------------------

    def _service(self, job: SimJob) -> float:
        """Service that sets its level: all of it, promoted or not, but since a batch chance
        while it lasts. Plus a micro-GPU-second: a job whose boundary was planned at a rung can
        reach it 1e-12 short (float sums), and would plan the same boundary again at the same
        time."""
        return job.attained - job.level_from + _SERVICE_EPS

    def _promoted_service(self, job: SimJob) -> float:
        """Service since its promotion: what ends the promotion (`Ladder.promotion_service`)."""
        return job.attained - job.promoted_at + _SERVICE_EPS

    def _share(self, job: SimJob) -> float:
        return self.user_share.get((job.t.user, job.rank), 0.0)

    def _standing(self, job: SimJob) -> ordering.Standing:
        return ordering.Standing(
            rank=job.rank,
            level=self.ladder.level(job.rank, self._service(job)),
            user_share_gpu_s=self._share(job),
            submitted=job.t.submit_s,
            job_id=job.idx,
            promoted=job.rank != job.home_rank,
            gpus=job.t.num_gpu,
        )

    def account(self, job: SimJob) -> None:
        before = job.attained
        super().account(job)
        gained = job.attained - before
        if gained > 0:
            key = (job.t.user, job.rank)
            self.user_share[key] = self._share(job) + gained * ordering.share_weight(self.now)
            # A promoted job is compared with its new tier's own by their users' shares
            # (`ordering.order_key_as_own`): across the two queues, any share of a user waiting
            # in either may change which goes first.
            own, promoted = self.queues[job.rank], self.queues[self.ranks + job.rank]
            user = job.t.user
            across = promoted.count > 0 and (own.has_user(user) or promoted.has_user(user))
            if across or own.share_matters(user):
                self._share_changes[job.rank] += 1

    # --- the queues ---------------------------------------------------------------------------

    def enqueue(self, job: SimJob) -> None:
        # Kept while it waits: nothing the order compares a waiting job by (level, tier,
        # promoted) changes until it runs again, but its user's share, which the queue reads
        # when it names its head (clockq/replay/tier_queue.py).
        job.standing = self._standing(job)
        self._queue_changes += 1
        self.queues[self._queue_of(job)].push(job.idx, job.qseq, job.t.user, job.standing)
        if job.rank == job.home_rank:
            if job.rank in self.promotable:
                self._keep_ticking(_PROMOTION_TICK, self.tick_s)
            if any(t.rank == job.rank for t in self.chance_tiers):
                self._keep_ticking(_BATCH_CHANCE, self.chance_every_s)

    def _queue_of(self, job: SimJob) -> int:
        """Its tier's queue: of the tier's own jobs, or of those promoted into it."""
        return job.rank + (self.ranks if job.rank != job.home_rank else 0)

    def _share_in(self, rank: int) -> Callable[[str], float]:
        return lambda user: self.user_share.get((user, rank), 0.0)

    def _is_queued(self, idx: int, qseq: int) -> bool:
        job = self.jobs[idx]
        return job.qseq == qseq and job.state == St.WAITING

    def head(self) -> SimJob | None:
        memo_key = (self._queue_changes, sum(self._share_changes), self.free, self.held_by_lower, self.held_by_promoted)
        if self._head_memo is not None and self._head_memo[0] == memo_key:
            self._head_rank, self._head_user = self._head_memo[1]
            return self._head_memo[2]
        job = self._pick_head()
        self._head_memo = (memo_key, (self._head_rank, self._head_user), job)
        return job

    def _pick_head(self) -> SimJob | None:
        heads = [
            q.head(self._share_in(i % self.ranks), self._share_changes[i % self.ranks]) if q.count else None
            for i, q in enumerate(self.queues)
        ]
        standings = [None if h is None else h[1].standing for h in heads]
        pick = ordering.pick_next(
            standings,
            held_by_lower=self.held_by_lower,
            total_gpus=self.cfg.gpus,
            free_gpus=self.free,
            held_by_promoted=self.held_by_promoted,
        )
        if pick is None:
            return None
        user, waiting = heads[pick]  # type: ignore[misc]
        self._head_rank, self._head_user = pick, user
        job = self.jobs[waiting.idx]
        job.standing = waiting.standing  # with its user's share as it is now
        return job

    def gpus_ahead_of_new(self, rank: int) -> int:
        """For admission: the waiting jobs as the order sees them (`control.gpus_ahead`),
        counted again only when the queues have changed."""
        if (memo := self._ahead_memo.get(rank)) is not None and memo[0] == self._queue_changes:
            return memo[1]
        waiting = (self.jobs[idx].standing for queue in self.queues for idx in queue.jobs())
        ahead = control.gpus_ahead(rank, waiting)
        self._ahead_memo[rank] = (self._queue_changes, ahead)
        return ahead

    def pop_head(self) -> SimJob:
        idx = self.queues[self._head_rank].pop(self._head_user)
        self._queue_changes += 1
        return self.jobs[idx]

    def left_queue(self, job: SimJob) -> None:
        self.queues[self._queue_of(job)].left()
        self._queue_changes += 1

    # --- running ------------------------------------------------------------------------------

    def began(self, job: SimJob) -> None:
        if job.slice_rank != job.rank:
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
        if job.idx == self.gathering_for:
            self.gathering_for = None
        job.got_gpus_at = self.now
        self.slices_started += 1
        self.started_since_tick.add(job.idx)
        job.mode = job.t.num_gpu if ordering.in_lower_share(job.rank) else 0  # its GPUs in the share
        self.held_by_lower += job.mode
        job.promoted_gpus = job.t.num_gpu if job.rank != job.home_rank else 0  # its GPUs in promoted jobs' share
        self.held_by_promoted += job.promoted_gpus
        self._plan(job)
        self._as_victim(job)

    def _plan(self, job: SimJob) -> None:
        """Its finish, or the boundary where its standing changes (a rung, its promotion's end)."""
        job.version += 1
        job.rate = 1.0
        self.schedule(self.now + job.remaining, Ev.FINISH, job)
        # GPU-seconds of service to the next change; `_service` reads a micro-GPU-second high
        service = self._service(job)
        rung = self.ladder.next_rung(job.rank, service)
        to_go = math.inf if rung is None else rung - service
        if job.rank != job.home_rank:
            to_go = min(to_go, self.ladder.promotion_service(job.rank) - self._promoted_service(job))
        if to_go < math.inf:
            to_go = max(to_go + _SERVICE_EPS, 0.0) / job.t.num_gpu
            if to_go < job.remaining - EPS:
                self.schedule(self.now + to_go, Ev.BOUNDARY, job)

    def _as_victim(self, job: SimJob) -> None:
        """Enter it among the victims, with its standing: what a victim is judged by (level,
        tier, promoted, GPUs) changes only at a boundary, which enters it again."""
        job.vseq += 1
        self.victims.add(job.idx, job.vseq, self._standing(job), job.switch_s)

    def stopped(self, job: SimJob) -> None:
        job.vseq += 1  # no longer a victim
        if job.idx in self.yielding:
            self.yielding.discard(job.idx)
            self.making_way -= job.t.num_gpu
            self._lower_leaving -= job.mode
            self._promoted_leaving -= job.promoted_gpus
        self.held_by_lower -= job.mode
        self.held_by_promoted -= job.promoted_gpus
        job.mode = job.promoted_gpus = 0

    def boundary(self, job: SimJob) -> None:
        self.account(job)
        if job.remaining <= EPS:
            self.finish(job)
            return
        if job.idx in self.yielding:  # it was told to make way: its slice is over
            self.leave_gpus(job, cost_s=job.switch_s)
            return
        if job.rank != job.home_rank and self.ladder.promotion_over(
            job.rank, self._promoted_service(job), tolerance_gpu_s=EPS
        ):
            job.rank, job.level_from = job.home_rank, 0.0  # a fair amount of service had: home
            self.held_by_promoted -= job.promoted_gpus
            job.promoted_gpus = 0
        self._plan(job)
        self._as_victim(job)
        self.dispatch()

    # --- making way ---------------------------------------------------------------------------

    def dispatch(self) -> None:
        super().dispatch()  # heads start while they fit
        if not self._making:
            self._making = True
            try:
                self._make_way()
                self._backfill()
            finally:
                self._making = False

    def _make_way(self) -> None:
        """While the job a free GPU would take next does not fit, the running job the policy
        names makes way for it (`making_way.make_way`, fed from the heaps of clockq/replay/
        victims.py), and leaves when the decision says (`MakeWay.leaves_at`)."""
        while (waiting := self.head()) is not None:
            found = self._decide(waiting.standing)
            if found is None:
                return
            victim, decision = found
            self.gathering_for = waiting.idx
            at = decision.leaves_at(now=self.now, got_gpus_at=victim.got_gpus_at, slice_s=victim.slice_s)
            if at <= self.now:
                self.account(victim)
                if victim.remaining <= EPS:
                    self.finish(victim)
                else:
                    self.leave_gpus(victim, cost_s=victim.switch_s)
            else:  # it makes way once it has had its slice
                self.yielding.add(victim.idx)
                self.making_way += victim.t.num_gpu
                self._lower_leaving += victim.mode
                self._promoted_leaving += victim.promoted_gpus
                victim.version += 1
                victim.vseq += 1
                self.account(victim)
                self.schedule(self.now + min(at - self.now, victim.remaining), Ev.BOUNDARY, victim)

    def _decide(self, waiting: ordering.Standing) -> tuple[SimJob, making_way.MakeWay] | None:
        """The policy's decision for the head (`making_way.make_way`), on the replay's state:
        the GPUs free, switching (`freeing`) and told to make way; the share's GPUs less those
        leaving. The victims' heaps feed it candidates; the one it names is taken out of them."""
        walks: list[Walk] = []

        def candidates(by_cost: bool) -> Walk:
            walks.append(self.victims.walk(waiting, by_cost))
            return walks[-1]

        decision = making_way.make_way(
            waiting,
            candidates,
            free_gpus=self.free,
            freeing_gpus=self.freeing,
            yielding_gpus=self.making_way,
            held_by_lower=self.held_by_lower - self._lower_leaving,
            total_gpus=self.cfg.gpus,
            held_by_promoted=self.held_by_promoted - self._promoted_leaving,
        )
        idx = walks[0].finish(decision) if walks else None
        if decision is None or idx is None:
            return None
        return self.jobs[idx], decision

    def _backfill(self) -> None:
        """The head does not fit (a gang): jobs behind it that `ordering.may_backfill` lets in
        take the free GPUs. Looks a few deep into each queue, as a claim would."""
        head = self.head()
        if head is None or self.free <= 0 or head.t.num_gpu <= self.free:
            return
        gathering = self.gathering_for == head.idx and (self.making_way > 0 or self.freeing > 0)
        if gathering:
            return
        # The same queues and free GPUs as at a look that found nothing: nothing to find.
        state = (self._queue_changes, self.free, self.held_by_lower, self.held_by_promoted)
        if state == self._backfill_found_nothing:
            return
        first = head.standing

        def started(idx: int) -> bool:
            job = self.jobs[idx]
            if job is head or self.free <= 0 or job.t.num_gpu > self.free:
                return False
            if not ordering.may_backfill(first, job.standing, head_gathering=False):
                return False
            self.waiting_count -= 1
            self.waiting_gpus -= job.t.num_gpu
            self._queue_changes += 1
            self._start(job)
            return True

        for queue in self.queues:
            queue.take_front(BACKFILL_DEPTH, started)
        if state == (self._queue_changes, self.free, self.held_by_lower, self.held_by_promoted):
            self._backfill_found_nothing = state

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
        """Its waiting jobs, oldest first."""
        jobs = [self.jobs[idx] for idx in self.queues[rank].jobs() if self.jobs[idx].home_rank == rank]
        return sorted(jobs, key=lambda j: (j.waiting_since, j.idx))

    def _promotion_tick(self) -> bool:
        """clockq.promotion_tick: the round since the last tick, judged by decide_round."""
        facts = promotion.RoundFacts(
            started_at=self.now - self.tick_s,
            # Jobs running start a live slice every S without an event here.
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
            self._promote(self.jobs[p.job_id], p)
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
                self._promote(self.jobs[p.job_id], p)
        return more

    def _promote(self, job: SimJob, p: promotion.Promotion) -> None:
        """It keeps its wait and its first submit time, and waits in the more urgent queue at
        the level its service gives it there: all of it, or since now for a batch chance
        (`Promotion.fresh_level`)."""
        self.queues[self._queue_of(job)].left()
        job.rank = self.tier_by_code[p.to_tier].rank
        job.promoted_at = job.attained
        job.level_from = job.attained if p.fresh_level else 0.0
        job.qseq += 1
        job.skipped_rounds = 0
        job.promotions += 1
        self.enqueue(job)
        self.dispatch()


__all__ = ["ClockqReplay", "Config"]
