"""A tier's queue in the simulator names the head that `ordering.order_key` names with every
user's share as it is now, however the shares changed while the jobs waited."""

from __future__ import annotations

import random

import pytest

from clockq.policy import ordering
from clockq.replay.tier_queue import TierQueue


def standing(rng: random.Random, job_id: int) -> ordering.Standing:
    return ordering.Standing(
        rank=2,
        level=rng.randrange(3),
        user_share_gpu_s=rng.uniform(0, 100),  # what it was when queued: the queue must not use it
        submitted=float(rng.randrange(50)),
        job_id=job_id,
        promoted=rng.random() < 0.2,
    )


@pytest.mark.parametrize("seed", range(30))
def test_the_head_is_the_first_in_the_order_with_the_shares_as_they_are(seed):
    rng = random.Random(seed)
    qseq: dict[int, int] = {}
    queue = TierQueue(lambda idx, seq: qseq.get(idx) == seq)
    waiting: dict[int, tuple[str, ordering.Standing]] = {}
    shares = {u: 0.0 for u in "abcd"}
    version = 0
    for step in range(200):
        action = rng.random()
        if action < 0.4 or not waiting:  # a job arrives
            user, s = rng.choice("abcd"), standing(rng, step)
            qseq[step] = 1
            waiting[step] = (user, s)
            queue.push(step, 1, user, s)
        elif action < 0.55:  # one leaves without being popped (a timeout, a promotion)
            idx = rng.choice(sorted(waiting))
            del waiting[idx], qseq[idx]
            queue.left()
        elif action < 0.8:  # a user's share grows (its running jobs were served)
            shares[rng.choice("abcd")] += rng.uniform(0, 50)
            version += 1
        else:  # the head is popped
            user, head = queue.head(shares.__getitem__, version)  # type: ignore[misc]
            assert queue.pop(user) == head.idx
            del waiting[head.idx], qseq[head.idx]
        expected = min(
            waiting, key=lambda i: ordering.order_key(waiting[i][1], share=shares[waiting[i][0]]), default=None
        )
        found = queue.head(shares.__getitem__, version)
        assert (None if found is None else found[1].idx) == expected
        assert queue.count == len(waiting)
        if found is not None:
            assert found[1].standing.user_share_gpu_s == shares[waiting[expected][0]]
