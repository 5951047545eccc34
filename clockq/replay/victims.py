"""The running jobs as victims, kept so that the policy's walk (`making_way.make_way`, which asks
`ordering.pick_victim`) can be fed fast: this module feeds it candidates and decides nothing.

The walk goes over the running jobs in `ordering.victim_key` order. Fed from one sorted list,
that walk is short for a job that takes the job furthest back in the order (it stops at the
first it may not displace), but not for an urgent one, which takes the cheapest switch among
the jobs it may displace and so passes over every cheaper job it may not: on 1,000 GPUs, most
of them. So the running jobs are kept twice:

- one heap in the order's victim key (furthest back first), for the jobs that wait their turn;
- one heap per class (`ordering.job_class`: level, tier), each by switch cost, for urgent jobs:
  only the classes the waiting job may take from (`ordering.may_displace_class`) are merged into
  the walk, so the jobs it may not displace are never looked at.

Entries are never removed in place: a job's entries go stale when its `vseq` changes (it left,
or its standing changed and it was entered again), and are dropped when they reach a top.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator

from clockq.policy import making_way, ordering

Entry = tuple[tuple, int, int, ordering.Standing]  # (victim key, job index, vseq, standing)


class Victims:
    def __init__(self, is_current: Callable[[int, int], bool]):
        self._current = is_current  # (job index, vseq) -> whether the entry is still the job's
        self._by_order: list[Entry] = []
        self._by_class: dict[tuple, list[Entry]] = {}

    def add(self, idx: int, vseq: int, standing: ordering.Standing, switch_s: float) -> None:
        key = ordering.victim_key(standing, switch_s, by_cost=False)
        heapq.heappush(self._by_order, (key, idx, vseq, standing))
        heap = self._by_class.setdefault(ordering.job_class(standing), [])
        heapq.heappush(heap, (ordering.victim_key(standing, switch_s, by_cost=True), idx, vseq, standing))

    def walk(self, waiting: ordering.Standing, by_cost: bool) -> Walk:
        """The running jobs as `making_way.make_way` walks them for `waiting`, in `victim_key`
        order with `by_cost`: its candidates. `Walk.finish` then takes out the one it chose."""
        if by_cost:
            return _ByClassWalk(self, waiting)
        return _HeapWalk(self, self._by_order)

    def pick(self, waiting: ordering.Standing, *, held_by_lower: int, total_gpus: int) -> int | None:
        """The index of the running job `making_way.make_way` names for `waiting` (which does not
        fit in the GPUs free), taken out of the structure (its other entry goes stale with the
        caller's vseq), or None."""
        walks: list[Walk] = []

        def candidates(by_cost: bool) -> Walk:
            walks.append(self.walk(waiting, by_cost))
            return walks[-1]

        decision = making_way.make_way(
            waiting, candidates, free_gpus=0, held_by_lower=held_by_lower, total_gpus=total_gpus
        )
        return walks[0].finish(decision) if walks else None

    def _clean(self, heap: list[Entry]) -> bool:
        """Drop stale entries from the top; whether a current one is left."""
        while heap:
            _, idx, vseq, _ = heap[0]
            if self._current(idx, vseq):
                return True
            heapq.heappop(heap)
        return False


class Walk:
    """One walk over the victims: iterate it for the candidates (the walk stops at the one the
    policy takes), then `finish` with the policy's decision."""

    def __iter__(self) -> Iterator[ordering.Standing]:
        raise NotImplementedError

    def finish(self, decision: making_way.MakeWay | None) -> int | None:
        """Put back the candidates passed over; take out the one `decision` names (the last
        yielded: the walk stopped at it) and return its job index, or None."""
        raise NotImplementedError


class _HeapWalk(Walk):
    """The walk over one heap: the first candidate is looked at in place; only the ones it
    passes over are taken out, and they go back."""

    def __init__(self, victims: Victims, heap: list[Entry]):
        self._victims, self._heap = victims, heap
        self._passed: list[Entry] = []

    def __iter__(self) -> Iterator[ordering.Standing]:
        while self._victims._clean(self._heap):
            yield self._heap[0][3]
            self._passed.append(heapq.heappop(self._heap))  # asked for the next one: this one is passed over

    def finish(self, decision: making_way.MakeWay | None) -> int | None:
        found = heapq.heappop(self._heap)[1] if decision is not None else None  # still on top
        for entry in self._passed:
            heapq.heappush(self._heap, entry)
        return found


class _ByClassWalk(Walk):
    """The walk over the classes `waiting` may take from (`ordering.may_displace_class`), merged
    by victim key: the classes it may not take from are never looked at."""

    def __init__(self, victims: Victims, waiting: ordering.Standing):
        self._victims = victims
        self._tops: list[tuple[tuple, tuple]] = []  # (top entry's key, class) of each class it may take from
        for cls, heap in victims._by_class.items():
            if ordering.may_displace_class(waiting, cls) and victims._clean(heap):
                self._tops.append((heap[0][0], cls))
        heapq.heapify(self._tops)
        self._passed: list[tuple[tuple, Entry]] = []
        self._at: tuple | None = None  # the class of the candidate last yielded

    def __iter__(self) -> Iterator[ordering.Standing]:
        tops, by_class = self._tops, self._victims._by_class
        while tops:
            _, cls = tops[0]
            heap = by_class[cls]
            self._at = cls
            yield heap[0][3]
            self._passed.append((cls, heapq.heappop(heap)))
            if self._victims._clean(heap):
                heapq.heapreplace(tops, (heap[0][0], cls))
            else:
                heapq.heappop(tops)

    def finish(self, decision: making_way.MakeWay | None) -> int | None:
        by_class = self._victims._by_class
        found = heapq.heappop(by_class[self._at])[1] if decision is not None and self._at is not None else None
        for cls, entry in self._passed:
            heapq.heappush(by_class[cls], entry)
        return found
