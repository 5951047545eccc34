"""The running jobs as victims, kept so that `ordering.pick_victim` can be fed fast.

`pick_victim` walks the running jobs in `ordering.victim_key` order. Fed from one sorted list,
that walk is short for a job that takes the job furthest back in the order (it stops at the
first it may not displace), but not for an urgent one, which takes the cheapest switch among
the jobs it may displace and so passes over every cheaper job it may not: on 1,000 GPUs, most
of them. So the running jobs are kept twice:

- one heap in the order's victim key (furthest back first), for the jobs that wait their turn;
- one heap per class (`ordering.job_class`: level, tier, promoted), each by switch cost, for
  urgent jobs: only the classes behind the waiting job's are merged into the walk, so the jobs
  it may not displace are never looked at.

Entries are never removed in place: a job's entries go stale when its `vseq` changes (it left,
or its standing changed and it was entered again), and are dropped when they reach a top.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator

from clockq.policy import ordering

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

    def pick(self, waiting: ordering.Standing, *, held_by_lower: int, total_gpus: int) -> int | None:
        """The index of the job `ordering.pick_victim` names for `waiting`, taken out of the
        structure (its other entry goes stale with the caller's vseq), or None."""
        if ordering.interrupts(waiting.rank):
            return self._pick_by_cost(waiting, held_by_lower=held_by_lower, total_gpus=total_gpus)
        return self._pick_from(self._by_order, waiting, held_by_lower=held_by_lower, total_gpus=total_gpus)

    def _pick_from(self, heap: list[Entry], waiting: ordering.Standing, **share) -> int | None:
        """The walk over one heap: the first candidate is looked at in place; only the ones it
        passes over are taken out, and they go back."""
        passed: list[Entry] = []

        def candidates() -> Iterator[ordering.Standing]:
            while self._clean(heap):
                yield heap[0][3]
                passed.append(heapq.heappop(heap))  # asked for the next one: this one is passed over

        pick = ordering.pick_victim(waiting, candidates(), **share)
        found = None
        if pick is not None:  # the walk stopped at it: it is still on top
            found = heapq.heappop(heap)[1]
        for entry in passed:
            heapq.heappush(heap, entry)
        return found

    def _pick_by_cost(self, waiting: ordering.Standing, **share) -> int | None:
        """The walk over the classes behind `waiting`'s, merged by victim key."""
        mine = ordering.job_class(waiting)
        tops: list[tuple[tuple, tuple]] = []  # (top entry's key, class) of each class behind mine
        rt = ordering.is_realtime(waiting.rank)
        for cls, heap in self._by_class.items():
            if mine < cls and self._clean(heap) and not (rt and ordering.is_realtime(cls[1])):
                tops.append((heap[0][0], cls))
        heapq.heapify(tops)
        passed: list[tuple[tuple, Entry]] = []
        at: list[tuple] = []  # the class of the candidate last yielded

        def candidates() -> Iterator[ordering.Standing]:
            while tops:
                _, cls = tops[0]
                heap = self._by_class[cls]
                at[:] = [cls]
                yield heap[0][3]
                passed.append((cls, heapq.heappop(heap)))
                if self._clean(heap):
                    heapq.heapreplace(tops, (heap[0][0], cls))
                else:
                    heapq.heappop(tops)

        pick = ordering.pick_victim(waiting, candidates(), **share)
        found = None
        if pick is not None:
            found = heapq.heappop(self._by_class[at[0]])[1]
        for cls, entry in passed:
            heapq.heappush(self._by_class[cls], entry)
        return found

    def _clean(self, heap: list[Entry]) -> bool:
        """Drop stale entries from the top; whether a current one is left."""
        while heap:
            _, idx, vseq, _ = heap[0]
            if self._current(idx, vseq):
                return True
            heapq.heappop(heap)
        return False
