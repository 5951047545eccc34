"""The live order: the queued and running jobs as clockq.policy.ordering sees them.

A dispatch message is a wake-up: the worker that takes one claims the job that comes first in
the order (`next_for_gpu`), and a running job leaves its GPU at a slice boundary only for a
waiting job that the order puts before it (`displacing`). Both read the database, the one
truth: the broker's queues hold wake-ups in tier order and say nothing of service or shares.

What the order is made of, per job: its service level (its run time on the ladder of the tier it
is scheduled in, `CLOCKQ_SERVICE_LADDER_S`; counted from `level_from_ms`, which a batch chance
sets), its tier (the one it is scheduled in), whether it is promoted, its owner's share of
recent service in that tier (`UserShare`) and its id, which is its first submission's place (a
job that yields keeps it). A promoted job keeps its service: the promotion moves it up among the
jobs of its level, behind the tier's own, except within promoted jobs' bounded share, where it
goes by its age among them (`ordering.pick_next`, `promoted_protects`); it is not made new. It
goes home once its service since the promotion (`promoted_run_ms`) is
`Ladder.promotion_service` (`Ladder.promotion_over`, asked by workers/run/tiers.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Collection
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F

from clockq.bus import free_gpus
from clockq.jobs import hot_sql
from clockq.jobs.hot_sql import column, table
from clockq.jobs.models import Job, QueueTier, UserShare
from clockq.jobs.tier_rank import rank_sql
from clockq.policy import making_way, ordering
from clockq.policy.states import JobState

# User shares count service as 2 ** (t / half-life) from this moment (`ordering.share_weight`),
# so that a stored share never needs to decay. A float holds that for 1,000 half-lives, some 19
# years at the default 7 days.
SHARE_EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Waiting:
    """A queued job at the head of its tier, as the order sees it, and how to claim it."""

    standing: ordering.Standing
    token: str


@dataclass(frozen=True)
class Running:
    standing: ordering.Standing
    switch_cost_s: float
    level_ms: int  # its service as its level counts it, as written at its last boundary
    worker: str = ""  # the worker (its GPU) that runs it


@functools.cache
def _ladder(rungs: tuple[float, ...]) -> ordering.Ladder:
    return ordering.Ladder(base_gpu_s=rungs)


def ladder() -> ordering.Ladder:
    return _ladder(tuple(settings.CLOCKQ_SERVICE_LADDER_S))


def heads() -> list[Waiting | None]:
    """The best queued job of each tier's own (by `ordering.order_key`), most urgent tier first,
    then the best of the jobs promoted into each tier (`head_index`): promoted jobs' bounded
    share picks from those (`ordering.pick_next`)."""
    tiers = ladder().tiers
    found: list[Waiting | None] = [None] * (2 * tiers)
    with connection.cursor() as cursor:
        cursor.execute(_heads_sql(connection.vendor, ladder()), [str(JobState.QUEUED)])
        for job_id, token, rank, level, promoted, share in cursor.fetchall():
            if rank in range(tiers):
                found[head_index(rank, promoted=bool(promoted))] = Waiting(
                    _standing(job_id, rank, level, promoted, share), token
                )
    return found


def head_index(rank: int, *, promoted: bool = False) -> int:
    """Where `heads` has the best waiting job of a tier's own, or of those promoted into it."""
    return rank + (ladder().tiers if promoted else 0)


def running() -> list[Running]:
    """Every running job, with its measured switch cost (the cost of making way)."""
    with connection.cursor() as cursor:
        cursor.execute(_running_sql(connection.vendor, ladder()), [str(JobState.RUNNING)])
        return [
            Running(_standing(job_id, rank, level, promoted, share), (cost_ms or 0.0) / 1000, int(served), worker)
            for job_id, rank, level, promoted, share, cost_ms, served, worker in cursor.fetchall()
        ]


def queued_by_class() -> list[ordering.Standing]:
    """The queued jobs as a closed admission weighs them: one standing per class (tier, service
    level, promoted), its `gpus` the jobs in it (one GPU each)."""
    with connection.cursor() as cursor:
        cursor.execute(_classes_sql(connection.vendor, ladder()), [str(JobState.QUEUED)])
        return [
            dataclasses.replace(_standing(0, rank, level, promoted, 0.0), gpus=int(count))
            for rank, level, promoted, count in cursor.fetchall()
        ]


def next_for_gpu(total_gpus: int) -> Waiting | None:
    """The queued job a free GPU takes: the first in the order, or a promoted job or the
    best-effort tiers' best while they hold less than their bounded share (`ordering.pick_next`)."""
    waiting = heads()
    now_running = [r.standing for r in running()]
    standings = [w.standing if w else None for w in waiting]
    best = ordering.pick_next(
        standings,
        held_by_lower=sum(r.gpus for r in now_running if ordering.in_lower_share(r.rank)),
        total_gpus=max(total_gpus, 1),
        free_gpus=1,
        held_by_promoted=sum(r.gpus for r in now_running if r.promoted),
    )
    return waiting[best] if best is not None else None


@dataclass(frozen=True)
class MakeWay:
    """What the order says at a running job's boundary."""

    mine: Waiting | None  # the waiting job this job leaves its GPU to now, or None: go on
    victim_id: int | None  # the running job that makes way for the first waiting job, if any
    # The policy's decision, whole (clockq/policy/making_way.py): set when this job leaves its
    # GPU now (`mine`), for the boundary to pass on as it is (`slicing.Boundary.making_way`).
    decision: making_way.MakeWay | None = None


def displacing(
    job_id: int,
    *,
    freed: Collection[str] = (),
    serving_ms: float = 0.0,
    held_s: float | None = None,
    slice_s: float = 0.0,
) -> Waiting | None:
    """The waiting job that running job `job_id` should leave its GPU to now, or None
    (`making_way.makes_way_for`). None too if the job is not running. See `make_way`."""
    return make_way(job_id, freed=freed, serving_ms=serving_ms, held_s=held_s, slice_s=slice_s).mine


def make_way(
    job_id: int,
    *,
    freed: Collection[str] = (),
    serving_ms: float = 0.0,
    held_s: float | None = None,
    slice_s: float = 0.0,
    passed_over: Collection[int] = (),
) -> MakeWay:
    """The order at running job `job_id`'s boundary (`making_way.victim_for`): whether it leaves
    its GPU now, and which running job makes way for the first waiting job.

    - `serving_ms` is the service of the slice it is ending, which its row does not count yet:
      it is judged at the level it has once the slice is written.
    - `freed`: the workers whose GPU left a job just now (clockq/bus/free_gpus.py, which says
      why that, and not the heartbeats, is what counts as free). One that runs a job again is
      not free. The pool is the running jobs' GPUs and the free ones.
    - `held_s`, for a slice that ended before its planned end (an interrupt): how long the job
      has held its GPU since its claim, and `slice_s` its planned slice. It leaves when
      `ordering.leaves_at` says: at once for a tier that interrupts, otherwise only once it has
      had a planned slice. A slice that ends on time has had one.
    - `passed_over`: running jobs that were named to make way for an urgent job and did not (a
      worker that died or hangs in a long step): they are left out, as if their GPUs were not
      in the pool, so that the next victim is named.
    """
    now_running = [r for r in running() if r.standing.job_id not in passed_over or r.standing.job_id == job_id]
    me = next((i for i, r in enumerate(now_running) if r.standing.job_id == job_id), None)
    if me is None:
        return MakeWay(None, None)
    mine = now_running[me]
    level = ladder().level(mine.standing.rank, (mine.level_ms + serving_ms) / 1000)
    now_running[me] = dataclasses.replace(mine, standing=dataclasses.replace(mine.standing, level=level))
    free = len(free_gpus.free_of(freed, {r.worker for r in now_running}))
    waiting = heads()
    found = making_way.victim_for(
        me,
        [r.standing for r in now_running],
        [r.switch_cost_s for r in now_running],
        [w.standing if w else None for w in waiting],
        total_gpus=sum(r.standing.gpus for r in now_running) + free,
    )
    if found is None:
        return MakeWay(None, None)
    chosen = waiting[found.waiting_index]
    assert chosen is not None
    victim_id = found.victim.job_id
    if found.victim_index != me:
        return MakeWay(None, victim_id)
    if held_s is not None and found.leaves_at(now=held_s, got_gpus_at=0.0, slice_s=slice_s) > held_s:
        return MakeWay(None, victim_id)
    return MakeWay(chosen, victim_id, found)


def describe(w: Waiting) -> str:
    """The waiting job in words, for a job's history (`making_way.describe`)."""
    return making_way.describe(w.standing)


def add_service(owner_id: int, tier_id: int, gpu_ms: float, at: dt.datetime) -> None:
    """Count `gpu_ms` of service given at `at` in the user's share of the tier."""
    if gpu_ms <= 0:
        return
    weighted = gpu_ms / 1000 * ordering.share_weight((at - SHARE_EPOCH).total_seconds())
    # Every slice boundary runs this: the statement written once (hot_sql), as the boundary's others.
    key, grow = {"user_id": owner_id, "tier_id": tier_id}, {"weighted_gpu_s": F("weighted_gpu_s") + weighted}
    if hot_sql.update(UserShare, key, grow):
        return
    with transaction.atomic():  # a savepoint: a first slice of the user's elsewhere may win the insert
        _, created = UserShare.objects.get_or_create(**key, defaults={"weighted_gpu_s": weighted})
    if not created:
        hot_sql.update(UserShare, key, grow)


def _standing(job_id: int, rank: int, level: int, promoted: int, share: float) -> ordering.Standing:
    # The id stands for the first submit time: ids are given in submission order, and kept.
    return ordering.Standing(
        rank=int(rank),
        level=int(level),
        user_share_gpu_s=float(share or 0.0),
        submitted=float(job_id),
        job_id=int(job_id),
        promoted=bool(promoted),
    )


# --- SQL, once per shape (vendor and ladder) -------------------------------------------------------


def _level_ms_sql() -> str:
    """A job's service as its level counts it: its run time, since a batch chance if it had one."""
    return f"(j.{column(Job, 'run_ms')} - j.{column(Job, 'level_from_ms')})"


def _level_sql(ladder: ordering.Ladder) -> str:
    """A job's service level: its service (`_level_ms_sql`) against the rungs of the tier it is
    scheduled in (`Ladder.level`)."""
    served, rank = _level_ms_sql(), _rank_sql()
    by_rank = []
    for r in range(ladder.tiers):
        steps = " ".join(f"WHEN {served} < {rung * 1000!r} THEN {i}" for i, rung in enumerate(ladder.rungs(r)))
        by_rank.append(f"WHEN {r} THEN CASE {steps} ELSE {len(ladder.rungs(r))} END")
    return f"CASE {rank} {' '.join(by_rank)} ELSE 0 END"


def _rank_sql() -> str:
    """The rank of the tier a job is scheduled in, from the joined tier row's code."""
    return rank_sql(f"t.{column(QueueTier, 'code')}")


def _promoted_sql() -> str:
    return f"CASE WHEN j.{column(Job, 'tier_id')} <> j.{column(Job, 'original_tier_id')} THEN 1 ELSE 0 END"


def _from_sql() -> str:
    tier_id, owner_id = column(Job, "tier_id"), column(Job, "owner_id")
    return (
        f"FROM {table(Job)} j JOIN {table(QueueTier)} t ON t.{column(QueueTier, 'id')} = j.{tier_id} "
        f"LEFT JOIN {table(UserShare)} s ON s.{column(UserShare, 'user_id')} = j.{owner_id} "
        f"AND s.{column(UserShare, 'tier_id')} = j.{tier_id} "
        f"WHERE j.{column(Job, 'state')} = %s"
    )


@functools.cache
def _heads_sql(_vendor: str, ladder: ordering.Ladder) -> str:
    share = f"COALESCE(s.{column(UserShare, 'weighted_gpu_s')}, 0)"
    inner = (
        f"SELECT j.{column(Job, 'id')} AS id, j.{column(Job, 'dispatch_token')} AS token, "
        f"{_rank_sql()} AS rnk, "
        f"{_level_sql(ladder)} AS lvl, {_promoted_sql()} AS promoted, {share} AS share {_from_sql()}"
    )
    numbered = (
        "SELECT id, token, rnk, lvl, promoted, share, ROW_NUMBER() OVER "
        f"(PARTITION BY rnk, promoted ORDER BY lvl, share, id) AS place FROM ({inner}) q"
    )
    return f"SELECT id, token, rnk, lvl, promoted, share FROM ({numbered}) n WHERE place = 1"


@functools.cache
def _classes_sql(_vendor: str, ladder: ordering.Ladder) -> str:
    inner = f"SELECT {_rank_sql()} AS rnk, {_level_sql(ladder)} AS lvl, {_promoted_sql()} AS promoted {_from_sql()}"
    return f"SELECT rnk, lvl, promoted, COUNT(*) FROM ({inner}) q GROUP BY rnk, lvl, promoted"


@functools.cache
def _running_sql(_vendor: str, ladder: ordering.Ladder) -> str:
    share = f"COALESCE(s.{column(UserShare, 'weighted_gpu_s')}, 0)"
    return (
        f"SELECT j.{column(Job, 'id')}, {_rank_sql()}, {_level_sql(ladder)}, {_promoted_sql()}, "
        f"{share}, j.{column(Job, 'switch_cost_ms')}, {_level_ms_sql()}, j.{column(Job, 'worker')} "
        f"{_from_sql()}"
    )
