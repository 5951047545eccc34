"""Urgent arrivals, as tables: which running jobs an arriving job of a tier may interrupt
(`may_interrupt`: those whose slice the live worker ends early to ask the order), and which one
the order then makes leave (`makes_way_for` with `leaves_at`)."""

from __future__ import annotations

import pytest

from clockq.policy import ordering
from clockq.policy.making_way import makes_way_for
from clockq.policy.ordering import Standing, leaves_at, may_interrupt

RT, HP, SP, BP, BK = range(5)


def job(rank=SP, level=0, job_id=0, promoted=False):
    return Standing(rank, level, 0.0, float(job_id), job_id=job_id, promoted=promoted)


@pytest.mark.parametrize(
    ("arrival", "running", "interrupted"),
    [
        (RT, job(HP), True),
        (RT, job(BK, level=3), True),
        (RT, job(RT, level=3), False),  # RT never displaces RT
        (HP, job(SP), True),
        (HP, job(HP, level=0), False),  # one class: the first come keeps its GPU
        (HP, job(HP, level=1), True),  # a long-served HP job sinks below a new one
        (HP, job(HP, level=0, promoted=True), True),  # a promoted job is behind the tier's own
        (HP, job(RT, level=1), True),  # levels come first, even for RT
        (HP, job(RT, level=0), False),
        (SP, job(BK, level=3), False),  # SP does not interrupt: it waits for a slice's end
        (BK, job(BK, level=3), False),
    ],
)
def test_which_running_jobs_an_arrival_may_interrupt(arrival, running, interrupted):
    assert may_interrupt(arrival, running) is interrupted


def test_of_the_interrupted_jobs_only_the_cheapest_switch_leaves_for_rt():
    # Both GPUs' jobs may be interrupted; each asks the order, and only the cheaper one leaves.
    running = [job(SP, job_id=1), job(BK, job_id=2)]
    costs = [0.050, 0.004]
    heads = [job(RT, job_id=3), None, None, None, None]
    assert all(may_interrupt(RT, r) for r in running)
    assert makes_way_for(0, running, costs, heads, total_gpus=2) is None
    assert makes_way_for(1, running, costs, heads, total_gpus=2) == RT


def test_an_interrupt_answered_by_a_free_gpu_makes_nobody_leave():
    running = [job(SP, job_id=1), job(BK, job_id=2)]
    heads = [job(RT, job_id=3), None, None, None, None]
    for me in (0, 1):
        assert makes_way_for(me, running, [0.01, 0.01], heads, total_gpus=3) is None


@pytest.mark.parametrize(
    ("waiting", "held_s", "leaves"),
    [
        (RT, 0.01, True),  # an urgent job's victim leaves at once
        (HP, 0.01, True),
        (SP, 0.01, False),  # another's only once it has had its planned slice (0.1 s)
        (SP, 0.25, True),
    ],
)
def test_a_slice_ended_early_leaves_at_once_only_for_a_tier_that_interrupts(waiting, held_s, leaves):
    at = leaves_at(now=held_s, got_gpus_at=0.0, slice_s=0.1, interrupt=ordering.interrupts(waiting))
    assert (at <= held_s) is leaves
