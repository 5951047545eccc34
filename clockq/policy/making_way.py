"""Who makes way: the one composition of the order's rules (clockq/policy/ordering.py) that both
the live boundary and the trace replay call.

The question is the same live and in the replay: the job a free GPU would take next does not fit
in the GPUs that are free or coming free; which running job leaves its GPUs to it, and when?

1. The waiting job is the head `ordering.pick_next` names (the order, and the best-effort
   tiers' bounded share).
2. If it fits in the GPUs free now, leaving now (a switch under way) or, unless its tier
   interrupts, already told to make way at their next boundary, nobody else makes way.
3. Otherwise the victim is the first running job `ordering.pick_victim` takes on its walk in
   `ordering.victim_key` order (by switch cost for a tier that interrupts, `walks_by_cost`).
4. The victim leaves at once for a tier that interrupts, else after its planned slice
   (`ordering.leaves_at`, `MakeWay.leaves_at`).

`make_way` is the composition, given the head and a feed of candidates. The live boundary asks it
over plain lists of every running job (`make_way_over`, as its own GPU sees it: `victim_for`,
clockq/jobs/order.py). The replay keeps its 100,000 jobs in heaps: it gives `make_way` the head
it keeps and the candidates its heaps yield (clockq/replay/victims.py), and decides nothing
itself; tests/replay/test_one_make_way.py checks that `make_way_over` on the replay's state
gives the replay's decision at every step of a replay.

The answer is a `MakeWay` value, not words: callers test it and read its fields, and
`describe()` is only for the people who read a job's history.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from clockq.policy import ordering
from clockq.policy.ordering import Standing
from clockq.policy.tiers import TIER_BY_RANK


def describe(s: Standing) -> str:
    """A job as the order sees it, in words: 'job #5 (HP, promoted, service level 0)'."""
    tier = TIER_BY_RANK.get(s.rank)
    promoted = ", promoted" if s.promoted else ""
    return f"job #{s.job_id} ({tier.code if tier else f'rank {s.rank}'}{promoted}, service level {s.level})"


@dataclass(frozen=True)
class MakeWay:
    """The order's decision: `waiting` should have GPUs now, and `victim` leaves its GPUs to it."""

    waiting: Standing
    victim: Standing
    waiting_index: int  # into the heads asked (`make_way`); -1 when the caller gave the head
    victim_index: int  # into the running jobs asked (`make_way`), or the candidates walked
    interrupt: bool  # the victim leaves at its next step (the waiting job's tier interrupts)

    def leaves_at(self, *, now: float, got_gpus_at: float, slice_s: float) -> float:
        """When the victim leaves its GPUs (`ordering.leaves_at`)."""
        return ordering.leaves_at(now=now, got_gpus_at=got_gpus_at, slice_s=slice_s, interrupt=self.interrupt)

    def describe(self) -> str:
        """The job made way for, in words, as a job's history says it."""
        return describe(self.waiting)


def walks_by_cost(waiting: Standing) -> bool:
    """Whether the candidates for `waiting` are walked cheapest switch first (`victim_key`'s
    `by_cost`): for a tier that interrupts, whose wait is the victim's checkpoint."""
    return ordering.interrupts(waiting.rank)


def head_fits(waiting: Standing, *, free_gpus: int, freeing_gpus: int = 0, yielding_gpus: int = 0) -> bool:
    """Whether `waiting` fits in the GPUs free, leaving now (`freeing_gpus`: their switch is
    under way) and, unless its tier interrupts (it takes a victim of its own at once),
    `yielding_gpus` already told to make way at their next boundary: then nobody else makes way."""
    coming = free_gpus + freeing_gpus + (0 if ordering.interrupts(waiting.rank) else yielding_gpus)
    return waiting.gpus <= coming


def make_way(
    waiting: Standing | None,
    candidates: Callable[[bool], Iterable[Standing]],
    *,
    free_gpus: int,
    held_by_lower: int,
    total_gpus: int,
    freeing_gpus: int = 0,
    yielding_gpus: int = 0,
    held_by_promoted: int = 0,
    waiting_index: int = -1,
) -> MakeWay | None:
    """Who makes way for `waiting`, the job a free GPU would take next (`ordering.pick_next`),
    or None: nobody, because nothing waits, it fits (`head_fits`), or nobody may make way for
    it. `candidates(by_cost)` gives the running jobs in `victim_key` order with that `by_cost`,
    consumed lazily (the walk stops at the victim), so that a caller may feed them from heaps;
    `victim_index` counts in that walk. `held_by_lower`, `held_by_promoted`: the GPUs the
    best-effort tiers and the promoted jobs hold, less those already told to make way (they
    protect their share no longer)."""
    if waiting is None:
        return None
    if head_fits(waiting, free_gpus=free_gpus, freeing_gpus=freeing_gpus, yielding_gpus=yielding_gpus):
        return None
    walked: list[Standing] = []

    def remembered() -> Iterator[Standing]:
        for c in candidates(walks_by_cost(waiting)):
            walked.append(c)
            yield c

    found = ordering.pick_victim(
        waiting, remembered(), held_by_lower=held_by_lower, total_gpus=total_gpus, held_by_promoted=held_by_promoted
    )
    if found is None:
        return None
    return MakeWay(waiting, walked[found], waiting_index, found, ordering.interrupts(waiting.rank))


def make_way_over(
    heads: Sequence[Standing | None],
    running: Sequence[Standing],
    switch_cost_s: Sequence[float],
    *,
    free_gpus: int,
    held_by_lower: int,
    total_gpus: int,
    freeing_gpus: int = 0,
    yielding_gpus: int = 0,
    yielding_lower: int = 0,
    held_by_promoted: int = 0,
    yielding_promoted: int = 0,
    as_seen_by: int | None = None,
) -> MakeWay | None:
    """`make_way` over plain lists: the head is the one `ordering.pick_next` names among `heads`
    (the best waiting job of each tier, None where none waits), the candidates every running
    job, sorted; the decision's indexes are into `heads` and `running`. `held_by_lower`,
    `held_by_promoted`: the GPUs the best-effort tiers and the promoted jobs hold, of which
    `yielding_lower` and `yielding_promoted` are already told to make way.
    `as_seen_by`, at a live boundary: the index of the running job that asks; the head is then
    the one its GPU would take if it were free."""
    if as_seen_by is None:
        lower, promoted, free = held_by_lower, held_by_promoted, free_gpus
    else:  # as if its GPUs were free
        mine = running[as_seen_by]
        lower = held_by_lower - (mine.gpus if ordering.in_lower_share(mine.rank) else 0)
        promoted = held_by_promoted - (mine.gpus if mine.promoted else 0)
        free = mine.gpus
    best = ordering.pick_next(
        heads, held_by_lower=lower, total_gpus=total_gpus, free_gpus=free, held_by_promoted=promoted
    )
    walk: list[int] = []

    def in_victim_order(by_cost: bool) -> Iterator[Standing]:
        walk[:] = sorted(
            range(len(running)), key=lambda i: ordering.victim_key(running[i], switch_cost_s[i], by_cost=by_cost)
        )
        return (running[i] for i in walk)

    found = make_way(
        None if best is None else heads[best],
        in_victim_order,
        free_gpus=free_gpus,
        held_by_lower=held_by_lower - yielding_lower,
        total_gpus=total_gpus,
        freeing_gpus=freeing_gpus,
        yielding_gpus=yielding_gpus,
        held_by_promoted=held_by_promoted - yielding_promoted,
    )
    if found is None or best is None:
        return None
    return MakeWay(found.waiting, found.victim, best, walk[found.victim_index], found.interrupt)


def victim_for(
    me: int,
    running: Sequence[Standing],
    switch_cost_s: Sequence[float],
    heads: Sequence[Standing | None],
    *,
    total_gpus: int,
) -> MakeWay | None:
    """As `running[me]` sees it at its live boundary: `make_way_over` every running job, the
    GPUs not held by them free, the shares' GPUs counted from them. `heads`: the best waiting
    job of each tier's own, then of each tier's promoted jobs (`ordering.pick_next`). Nobody
    makes way while a GPU is free: the waiting job takes that one, as when a victim has just
    left and its GPU is claiming."""
    return make_way_over(
        heads,
        running,
        switch_cost_s,
        free_gpus=total_gpus - sum(r.gpus for r in running),
        held_by_lower=sum(r.gpus for r in running if ordering.in_lower_share(r.rank)),
        held_by_promoted=sum(r.gpus for r in running if r.promoted),
        total_gpus=total_gpus,
        as_seen_by=me,
    )


def makes_way_for(
    me: int,
    running: Sequence[Standing],
    switch_cost_s: Sequence[float],
    heads: Sequence[Standing | None],
    *,
    total_gpus: int,
) -> int | None:
    """At a live slice boundary of `running[me]`: the index into `heads` of the waiting job it
    leaves its GPU to, or None to go on: only if it is the victim `victim_for` names. Every GPU
    asks at its own boundary, and only the chosen one makes way, as the simulator chooses one
    victim. Another GPU's victim that is not at its boundary yet leaves at its own, which is at
    most one planned slice away (`leaves_at`)."""
    found = victim_for(me, running, switch_cost_s, heads, total_gpus=total_gpus)
    return found.waiting_index if found is not None and found.victim_index == me else None
