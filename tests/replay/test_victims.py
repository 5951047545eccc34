"""The simulator's victim structure names the victim that `ordering.pick_victim` names over a
plain sorted list of every running job: it only feeds the same walk faster."""

from __future__ import annotations

import random

import pytest

from clockq.policy import ordering
from clockq.replay.victims import Victims

TOTAL = 40


def standing(rng: random.Random, job_id: int) -> ordering.Standing:
    return ordering.Standing(
        rank=rng.randrange(5),
        level=rng.randrange(4),
        user_share_gpu_s=0.0,
        submitted=float(rng.randrange(1000)),
        job_id=job_id,
        promoted=rng.random() < 0.2,
        gpus=rng.choice((1, 1, 1, 2, 4)),
    )


def plain_pick(waiting, running, costs, held_by_lower):
    by_cost = ordering.interrupts(waiting.rank)
    walk = sorted(running, key=lambda i: ordering.victim_key(running[i], costs[i], by_cost=by_cost))
    pick = ordering.pick_victim(waiting, (running[i] for i in walk), held_by_lower=held_by_lower, total_gpus=TOTAL)
    return None if pick is None else walk[pick]


@pytest.mark.parametrize("seed", range(40))
def test_it_names_the_victim_a_plain_walk_names(seed):
    rng = random.Random(seed)
    vseq: dict[int, int] = {}
    victims = Victims(lambda idx, seq: vseq.get(idx) == seq)
    running: dict[int, ordering.Standing] = {}
    costs: dict[int, float] = {}
    for idx in range(rng.randrange(1, 30)):
        running[idx], costs[idx] = standing(rng, idx), rng.choice((0.01, 0.1, 0.5, 1.0))
        vseq[idx] = 1
        victims.add(idx, 1, running[idx], costs[idx])
    # Some jobs left, and some were entered again with a new standing (their old entry stale)
    for idx in rng.sample(sorted(running), len(running) // 3):
        if rng.random() < 0.5:
            del running[idx], vseq[idx]
        else:
            running[idx], vseq[idx] = standing(rng, idx), 2
            victims.add(idx, 2, running[idx], costs[idx])
    for _ in range(5):
        waiting = standing(rng, 1000)
        held = rng.randrange(0, 8)
        expected = plain_pick(waiting, running, costs, held)
        assert victims.pick(waiting, held_by_lower=held, total_gpus=TOTAL) == expected
        if expected is not None:  # the caller takes it out of the running
            del running[expected], vseq[expected]
