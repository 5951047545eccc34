"""One tier's waiting jobs in the simulator, in `ordering.order_key` order with shares as they are.

The order compares two jobs of one class by their users' recent service in the tier (fair share),
and that service grows whenever a user's job runs: a key computed when a job was queued goes
stale. Live, every read computes it afresh (clockq/jobs/order.py). Here each user's jobs are kept
in a heap of their own, in which the share is the same for all and so cannot reorder them; the
tier's head is the best of the users' heads, keyed with each user's share when it is asked for.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Iterator

from clockq.policy import ordering

Entry = tuple[ordering.Key, int, int]  # (order key with the share left out, job index, qseq)


@dataclasses.dataclass
class Waiting:
    """A job's place in its user's heap, and its standing with its user's share left out."""

    idx: int
    qseq: int
    standing: ordering.Standing


class TierQueue:
    def __init__(self, is_current: Callable[[int, int], bool]):
        self._current = is_current  # (job index, qseq) -> whether the entry still stands for it
        self._by_user: dict[str, list[tuple[ordering.Key, int, int, ordering.Standing]]] = {}
        self.count = 0
        self._version = 0  # changes whenever a job enters or leaves
        self._head: tuple[tuple[int, int], tuple[str, Waiting] | None] | None = None  # the last head named

    def push(self, idx: int, qseq: int, user: str, standing: ordering.Standing) -> None:
        unshared = dataclasses.replace(standing, user_share_gpu_s=0.0)
        heapq.heappush(self._by_user.setdefault(user, []), (ordering.order_key(unshared), idx, qseq, unshared))
        self.count += 1
        self._version += 1

    def share_matters(self, user: str) -> bool:
        """Whether a change of `user`'s share can change the head: it may have jobs waiting
        here, and so may another user (one user's share orders nothing among its own jobs)."""
        if not self._by_user.get(user):
            return False
        return any(heap for other, heap in self._by_user.items() if other != user)

    def has_user(self, user: str) -> bool:
        """Whether `user` may have jobs waiting here (entries, some perhaps stale)."""
        return bool(self._by_user.get(user))

    def left(self) -> None:
        """One of its jobs left the queue without being popped (its entry goes stale)."""
        self.count -= 1
        self._version += 1

    def head(self, share: Callable[[str], float], shares_version: int) -> tuple[str, Waiting] | None:
        """The first job in the order, with its user (to `pop` it); its standing carries its
        user's share now. `shares_version` changes whenever a share of this tier does: until
        it or the queue changes, the head is the one last named."""
        if self._head is not None and self._head[0] == (self._version, shares_version):
            return self._head[1]
        found = self._find_head(share)
        self._head = ((self._version, shares_version), found)
        return found

    def _find_head(self, share: Callable[[str], float]) -> tuple[str, Waiting] | None:
        best: tuple[ordering.Key, str, float] | None = None
        for user, heap in self._by_user.items():
            if not self._clean(heap):
                continue
            users_share = share(user)
            key = ordering.order_key(heap[0][3], share=users_share)
            if best is None or key < best[0]:
                best = (key, user, users_share)
        if best is None:
            return None
        _, user, users_share = best
        _, idx, qseq, unshared = self._by_user[user][0]
        return user, Waiting(idx, qseq, dataclasses.replace(unshared, user_share_gpu_s=users_share))

    def pop(self, user: str) -> int:
        """Take the head of `user`'s jobs (as `head` named it) out of the queue."""
        self.count -= 1
        self._version += 1
        return heapq.heappop(self._by_user[user])[1]

    def take_front(self, depth: int, taken: Callable[[int], bool]) -> None:
        """Look at up to `depth` waiting jobs of each user, best first, and take out of the
        queue those that `taken(index)` says were taken (started); the others stay."""
        for heap in self._by_user.values():
            kept: list[tuple[ordering.Key, int, int, ordering.Standing]] = []
            while heap and len(kept) < depth:
                entry = heapq.heappop(heap)
                if not self._current(entry[1], entry[2]):
                    continue  # stale
                if taken(entry[1]):
                    self.count -= 1
                    self._version += 1
                else:
                    kept.append(entry)
            for entry in kept:
                heapq.heappush(heap, entry)

    def jobs(self) -> Iterator[int]:
        """Every waiting job's index, in no order."""
        for heap in self._by_user.values():
            for _, idx, qseq, _ in heap:
                if self._current(idx, qseq):
                    yield idx

    def _clean(self, heap: list) -> bool:
        while heap:
            if self._current(heap[0][1], heap[0][2]):
                return True
            heapq.heappop(heap)
        return False
