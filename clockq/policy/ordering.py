"""Who gets a GPU: the order of jobs, which running job makes way, and the lower tiers' share.

This is the seam every scheduling decision about order goes through. The trace simulator keeps
its jobs in structures keyed by these functions' keys; the live system asks the same functions.

- **Service levels (tier-weighted, discretised LAS).** A job's level is the number of rungs of
  the service ladder its attained service (GPUs x seconds) has passed. Each tier stretches the
  ladder by its weight: x1.25 for each step of urgency, so an RT job stays on a level about 2.4
  times as long as a BK job. That is Tiresias's discretised least-attained-service (Gu et al.,
  NSDI '19), which needs no job sizes, told what the tiers say about urgency. The weight is
  mild on purpose: a steep one (x2 per step, RT 16x) keeps long urgent jobs ahead of short
  lower-tier ones, which is processor order by tier again and costs mean completion time
  under overload; with no weight at all, long urgent jobs miss their deadlines under
  overload, as under plain LAS. A long job of any
  tier sinks below new work, so a months-long service cannot starve a queue, and a new job of
  any tier starts soon; a new urgent job starts first.
- **Order.** Level first, then tier, then the tier's own jobs before jobs promoted into it,
  then the user's share of recent service in that tier (fair share: a user with 500 waiting
  jobs does not crowd out one with one), then the time the job was first submitted. A job that
  yields keeps its place: it re-enters with its first submit time, not the time it yielded.
- **Promotion.** A promoted job is scheduled in the more urgent tier at the level its whole
  service gives it on that tier's ladder, behind that tier's own jobs of the same level: it goes
  ahead of the jobs of its level in its own tier and the tiers below, but it is not made new. A
  promotion that counted service afresh made every long job that skipped three rounds a new
  job, which displaced running work and was displaced again a rung later, round after round:
  preemptions grew with the number of waiting jobs (docs/replay.md has the figures). It keeps
  the promotion until it has had the first rung of service there since it was promoted
  (`Ladder.promotion_service`, `Ladder.promotion_over`), then goes home.
- **Promoted jobs' share.** Behind the new tier's own jobs alone, a promoted job never ran under
  a steady stream of them: the starvation promotion is for. So promoted jobs have a bounded
  share of the GPUs, as the best-effort tiers have theirs: `PROMOTED_SHARE`, at least one GPU on
  a cluster of two or more. A promoted job that fits in what is left of it goes by its age
  among its new tier's jobs of its level, as if it were the tier's own (ahead of the newer
  ones, `order_key_as_own`), and while the running promoted jobs fit in it they keep their GPUs
  against anything but RT until they go home or end (`promoted_share_gpus`,
  `promoted_protects`): they are not taken back by the next job of their new tier, which
  would be churn. Bounded, so that a
  saturated cluster does not turn every starved SP job into HP work: ordering every promoted
  job by age among the new tier's jobs did, and HP's mean wait on the Tiresias trace at 8 GPUs
  went from 27 s to 4.8 min (docs/benchmarks.md).
- **Making way.** A waiting job displaces a running one only if it comes before it in that
  order, and the victim leaves once it has had a planned slice (long enough, by
  `slicing.plan_slice`, to keep its switch within the overhead budget); for the urgent tiers
  (RT and HP, `interrupts`) it leaves at once. For them the cheapest switch among the jobs they
  may displace goes first (their wait is the victim's checkpoint); for others the job furthest
  back in the order, the cheapest first among equals (`victim_key`, `pick_victim`). These are
  composed once, in clockq/policy/making_way.py, which the live boundary and the replay both call.
- **Backfill.** A job that needs more GPUs than are free (a gang) holds its place; jobs behind
  it may use the free GPUs meanwhile, and make way for it after a slice (`may_backfill`).
- **Lower tiers' share.** While jobs of the best-effort tiers (BP, BK) wait and hold less than
  `LOWER_TIER_SHARE` of the GPUs, a free GPU goes to the best of them: a bounded share, so they
  progress under saturation without taking GPUs from RT or HP beyond it.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from clockq.policy.tiers import BEST_EFFORT_RANKS, INTERRUPTING_RANKS, REALTIME_RANKS, TIERS

# The ladder for the least urgent tier, in GPU-seconds: 5 GPU-minutes, then x4 per rung (20
# and 80 GPU-minutes, 5.3, 21 and 85 GPU-hours). Geometric rungs: a job's level tells its
# service within a factor of 4, whatever the trace's time scale. Finer rungs come nearer to
# plain least-attained-service, which suits heavy-tailed run times (the longer a job has run,
# the longer it is likely to run on), at the cost of a displacement at each rung a job crosses
# while better work waits. x4 is where the replays found that balance (docs/replay.md): x8 cost
# mean completion time under overload, x2 doubled the preemptions for little gain.
BASE_LADDER_GPU_S: tuple[float, ...] = (300.0, 1_200.0, 4_800.0, 19_200.0, 76_800.0, 307_200.0)
# Each step of urgency stretches the ladder (RT 2.44x, HP 1.95x, SP 1.56x, BP 1.25x, BK 1x with
# five tiers); see the module docstring for why mild.
WEIGHT_PER_RANK = 1.25
# Which tiers interrupt their victim, which share the best-effort GPUs and which are real-time
# is each tier's own (`TierSpec.interrupts`, `.best_effort`, `.realtime` in clockq/policy/tiers.py).
# The best-effort tiers' bounded share of the GPUs under saturation:
LOWER_TIER_SHARE = 0.1
# Promoted jobs' bounded share of the GPUs (module docstring): as the best-effort tiers'.
PROMOTED_SHARE = 0.1
# A user's recent service decays with this half-life (Slurm's PriorityDecayHalfLife default).
FAIR_SHARE_HALF_LIFE_S = 7 * 86_400.0
# A fair amount of service for a promoted job before it goes home: the first rung of the tier
# it was promoted to.
PROMOTION_RUNGS = 1


@dataclass(frozen=True)
class Ladder:
    """The service ladder: rungs for the least urgent tier, stretched per tier."""

    base_gpu_s: tuple[float, ...] = BASE_LADDER_GPU_S
    weight_per_rank: float = WEIGHT_PER_RANK
    tiers: int = len(TIERS)

    def __post_init__(self) -> None:
        rungs = self.base_gpu_s
        finite = all(math.isfinite(r) for r in rungs)
        if not rungs or not finite or rungs[0] <= 0 or any(a >= b for a, b in itertools.pairwise(rungs)):
            raise ValueError("the service ladder's rungs must be finite, positive and strictly increasing")
        if not (self.weight_per_rank >= 1 and math.isfinite(self.weight_per_rank)):
            raise ValueError("the ladder's weight per rank must be a number >= 1")
        # The simulator asks for a level millions of times a replay: stretch the rungs once.
        per_rank = tuple(tuple(r * self.weight(rank) for r in rungs) for rank in range(self.tiers))
        object.__setattr__(self, "_rungs_by_rank", per_rank)

    def weight(self, rank: int) -> float:
        return self.weight_per_rank ** (self.tiers - 1 - rank)

    def rungs(self, rank: int) -> tuple[float, ...]:
        return self._rungs_by_rank[rank]  # type: ignore[attr-defined]

    def level(self, rank: int, attained_gpu_s: float) -> int:
        """How many rungs of its tier's ladder the service has passed."""
        return bisect.bisect_right(self.rungs(rank), attained_gpu_s)

    def next_rung(self, rank: int, attained_gpu_s: float) -> float | None:
        """The service at which the job drops a level; None on the last one."""
        rungs = self.rungs(rank)
        i = bisect.bisect_right(rungs, attained_gpu_s)
        return rungs[i] if i < len(rungs) else None

    def promotion_service(self, to_rank: int) -> float:
        """Service a promoted job gets in its new tier before it returns home."""
        return sum(self.rungs(to_rank)[:PROMOTION_RUNGS])

    def promotion_over(self, to_rank: int, served_gpu_s: float, *, tolerance_gpu_s: float = 0.0) -> bool:
        """Whether a job promoted to this tier, with this service there since its promotion,
        has had its fair amount (`promotion_service`) and returns home, its level counting all
        its service again. The live boundary and the replay both ask this; the replay's clock
        sums floats and passes its own tolerance."""
        return served_gpu_s >= self.promotion_service(to_rank) - tolerance_gpu_s


DEFAULT_LADDER = Ladder()


@dataclass(frozen=True)
class Standing:
    """What the order knows of a job, waiting or running."""

    rank: int  # the tier it is scheduled in now (its own, or the one it was promoted to)
    level: int  # its service level (Ladder.level) in that tier
    user_share_gpu_s: float  # its user's recent service in that tier, counted by `share_weight`
    submitted: float  # when it was first submitted (seconds on any clock), also after it yielded
    job_id: int = 0  # ties broken by id, so the order is total
    promoted: bool = False  # scheduled in a tier above its own (a promotion or a batch chance)
    gpus: int = 1  # how many it needs at once (a gang needs them all)


Key = tuple[int, int, bool, float, float, int]


def order_key(s: Standing, *, share: float | None = None) -> Key:
    """Sort key: smaller goes first. `share`, if given, stands for the standing's user share:
    the share changes while a job waits (its user's other jobs run), the rest does not."""
    return (s.level, s.rank, s.promoted, s.user_share_gpu_s if share is None else share, s.submitted, s.job_id)


def order_key_as_own(s: Standing) -> tuple[int, int, float, float, int]:
    """The order as if a promoted job were its new tier's own: level, tier, share, age. What
    promoted jobs go by within their share (`pick_next`)."""
    return (s.level, s.rank, s.user_share_gpu_s, s.submitted, s.job_id)


def job_class(s: Standing) -> tuple[int, int, bool]:
    """The class a job is displaced by: its level, its tier, and whether it is promoted. Jobs
    of one class never displace one another (`outranks`)."""
    return (s.level, s.rank, s.promoted)


def outranks(waiting: Standing, running: Standing) -> bool:
    """Whether a waiting job is in a better class than a running one: a better level, else a
    more urgent tier, else its own tier's job against a promoted one. Within a class nobody
    is displaced (the first come keeps its GPU), as in Tiresias, where preemption happens
    only across queues: taking turns within a class would be processor sharing, which slows
    every job of the class and makes none of them finish sooner. The user share is left out
    too: a job does not leave its GPU because its owner's share grew while it ran. (A promoted
    job within its share is kept from displacement apart: `promoted_protects`.)"""
    return job_class(waiting) < job_class(running)


def may_displace(waiting: Standing, running: Standing) -> bool:
    """Whether `waiting` should have `running`'s GPU: it comes first in the order. RT does not
    displace RT (it waits for a free GPU or a lower-tier victim): an RT job's slice is the
    latency promise of another RT job."""
    if running.rank in REALTIME_RANKS and waiting.rank in REALTIME_RANKS:
        return False
    return outranks(waiting, running)


def is_realtime(rank: int) -> bool:
    """Whether a tier of this rank is real-time work (`TierSpec.realtime`)."""
    return rank in REALTIME_RANKS


def may_displace_class(waiting: Standing, running_class: tuple[int, int, bool]) -> bool:
    """`may_displace` for every running job of a class (`job_class`: level, tier), which is all
    it depends on: a victim structure that keeps its jobs by class skips the classes it may not
    take from without looking at their jobs (clockq/replay/victims.py)."""
    return _class_displaces(job_class(waiting), running_class)


@functools.cache
def _class_displaces(waiting_class: tuple[int, int, bool], running_class: tuple[int, int, bool]) -> bool:
    (w_level, w_rank, w_promoted), (level, rank, promoted) = waiting_class, running_class
    return may_displace(
        Standing(w_rank, w_level, 0.0, 0.0, promoted=w_promoted), Standing(rank, level, 0.0, 0.0, promoted=promoted)
    )


def interrupts(rank: int) -> bool:
    """Whether a waiting job of this tier makes its victim leave at once (`leaves_at`)."""
    return rank in INTERRUPTING_RANKS


def may_interrupt(rank: int, running: Standing) -> bool:
    """Whether a job of this tier arriving now could make `running` leave at once: its tier
    interrupts, and a new job of it (level 0, the tier's own) may displace `running`. Whether it
    does is still `making_way.makes_way_for`'s to say, which knows the other running jobs and
    the free GPUs."""
    arrival = Standing(rank=rank, level=0, user_share_gpu_s=0.0, submitted=0.0)
    return interrupts(rank) and may_displace(arrival, running)


def leaves_at(*, now: float, got_gpus_at: float, slice_s: float, interrupt: bool) -> float:
    """When a victim leaves its GPU: at once for an urgent tier's job (its interrupt ends the
    slice at the next step); otherwise once it has had one planned slice since it got the GPU,
    and at once if it has. `slicing.plan_slice` makes a slice long enough that its switch stays within the
    overhead budget, so a job is never displaced more often than the budget allows: the
    minimum run time, relative to the switch cost, that keeps jobs from thrashing."""
    if interrupt:
        return now
    return max(now, got_gpus_at + slice_s)


def victim_key(running: Standing, switch_cost_s: float, *, by_cost: bool) -> tuple:
    """Sort key of a running job as a victim: smaller makes way first. For an urgent tier
    (`interrupts`, `by_cost`) the cheapest switch, since its wait is the victim's checkpoint;
    otherwise the job furthest back in the order, the cheapest among equals. Ties: furthest
    back in the order first."""
    back = (-running.level, -running.rank, not running.promoted)
    if by_cost:
        return (switch_cost_s, *back, -running.submitted)
    return (*back, switch_cost_s, -running.submitted)


def pick_victim(
    waiting: Standing,
    candidates: Iterable[Standing],
    *,
    held_by_lower: int,
    total_gpus: int,
    held_by_promoted: int = 0,
) -> int | None:
    """Which running job makes way for `waiting`: the index into `candidates` (the running jobs
    in `victim_key` order, `by_cost` for an urgent tier), or None. The walk passes over the
    jobs the bounded shares protect (the best-effort tiers', `held_by_lower`, and promoted
    jobs', `held_by_promoted`: the GPUs each holds, less those already leaving). For an urgent
    tier it passes over the jobs it may not displace too (a more expensive job behind them may
    be one it may); otherwise it stops at the first job `waiting` may not displace: with the
    furthest back first, a job better placed than it is never taken, nor any behind it.
    `candidates` is consumed lazily, so a caller may feed it from a heap. For a gang, call it
    again after each victim, with the shares updated."""
    by_cost, for_rt = interrupts(waiting.rank), is_realtime(waiting.rank)
    for i, running in enumerate(candidates):
        if share_protects(running, for_rt=for_rt, held_by_lower=held_by_lower, total_gpus=total_gpus):
            continue
        if promoted_protects(running, for_rt=for_rt, held_by_promoted=held_by_promoted, total_gpus=total_gpus):
            continue
        if may_displace(waiting, running):
            return i
        if not by_cost:
            return None
    return None


def lower_share_gpus(total_gpus: int) -> int:
    """The best-effort tiers' share in whole GPUs: none on a cluster too small for a tenth of
    it to be a GPU (on one GPU, a share would be the whole cluster)."""
    return math.floor(LOWER_TIER_SHARE * total_gpus)


def in_lower_share(rank: int) -> bool:
    """Whether a tier of this rank is one of the best-effort tiers that share `LOWER_TIER_SHARE`."""
    return rank in BEST_EFFORT_RANKS


def pick_next(
    heads: Sequence[Standing | None],
    *,
    held_by_lower: int,
    total_gpus: int,
    free_gpus: int,
    held_by_promoted: int = 0,
) -> int | None:
    """Which queue's head a free GPU takes: the index into `heads` (the best waiting job of each
    queue, None where a queue is empty; a tier's promoted jobs are a queue of their own), or
    None if nothing waits. The first in the order, unless promoted jobs hold less than their
    bounded share: then the best of them that fits in the free GPUs and is ahead of the first
    by its age among its new tier's jobs of its level (`order_key_as_own`); else unless the
    best-effort tiers hold less than theirs: then the best of them that fits. RT never gives
    way to a share."""
    present = [(order_key(s), i) for i, s in enumerate(heads) if s is not None]
    if not present:
        return None
    best = min(present)[1]
    first = heads[best]
    assert first is not None
    if is_realtime(first.rank):
        return best
    if not first.promoted and held_by_promoted < promoted_share_gpus(total_gpus):
        # Within their share, promoted jobs go by their age among their new tier's jobs of
        # their level, as if they were its own: ahead of the newer ones, not of the older.
        first_as_own = order_key_as_own(first)
        ahead = [
            (order_key_as_own(s), i)
            for i, s in enumerate(heads)
            if s is not None
            and s.promoted
            and s.gpus <= free_gpus
            and held_by_promoted + s.gpus <= promoted_share_gpus(total_gpus)
            and order_key_as_own(s) < first_as_own
        ]
        if ahead:
            return min(ahead)[1]
    if in_lower_share(first.rank) or held_by_lower >= lower_share_gpus(total_gpus):
        return best
    lower = [(key, i) for key, i in present if in_lower_share(key[1]) and heads[i].gpus <= free_gpus]  # type: ignore[union-attr]
    return min(lower)[1] if lower else best


def promoted_share_gpus(total_gpus: int) -> int:
    """Promoted jobs' share in whole GPUs: a tenth, and at least one on a cluster of two or
    more (a promoted job must be able to run at all: that is what promotion is for); none on
    one GPU, where a share would be the whole cluster."""
    return 0 if total_gpus < 2 else max(1, math.floor(PROMOTED_SHARE * total_gpus))


def promoted_protects(running: Standing, *, for_rt: bool, held_by_promoted: int, total_gpus: int) -> bool:
    """Whether a promoted job keeps its GPUs against a waiting job: while the promoted jobs that
    run hold no more than their bounded share, it has its service in its new tier until it goes
    home (`Ladder.promotion_over`) or ends, and is not taken back by the next job of that tier.
    Only RT takes from it, as from the best-effort tiers' share. Unlike theirs, the share is
    never overrun: a gang larger than it is not let in by it, nor kept by it (on 16 GPUs an
    8-GPU gang kept so held HP's work off half the cluster)."""
    if for_rt or not running.promoted:
        return False
    return held_by_promoted <= promoted_share_gpus(total_gpus)


def share_protects(running: Standing, *, for_rt: bool, held_by_lower: int, total_gpus: int) -> bool:
    """Whether a best-effort job keeps its GPUs against a waiting job because taking them would
    put the best-effort tiers below their bounded share. Only RT takes from the share: a share
    that the next HP job could take back would be started and taken back forever."""
    if for_rt or not in_lower_share(running.rank):
        return False
    return held_by_lower - running.gpus < lower_share_gpus(total_gpus)


def may_backfill(head: Standing, candidate: Standing, *, head_gathering: bool) -> bool:
    """Whether `candidate`, behind a head that does not fit in the free GPUs (a gang), may start
    on them meanwhile: only if it would make way for the head (so the head is never starved by
    what it let in), and not while GPUs are being freed for the head (they are the head's)."""
    return not head_gathering and outranks(head, candidate)


def share_weight(at_s: float, half_life_s: float = FAIR_SHARE_HALF_LIFE_S) -> float:
    """What a GPU-second of service given at `at_s` counts in a user's share. A user's recent
    service decays with a half-life (Slurm's fair-share decay); since every share decays by the
    same factor, counting each gain as gain x 2 ** (t / half-life) instead keeps the order of
    the shares at every moment, and a share read at one time compares with one read later (a
    key stored in a queue does not go stale as time passes)."""
    return 2.0 ** (at_s / half_life_s)
