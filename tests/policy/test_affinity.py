"""The warm-GPU affinity rule (clockq/policy/affinity.py), as a table."""

from __future__ import annotations

import pytest

from clockq.policy.affinity import WARM_WAIT_S, wait_for_warm_s


@pytest.mark.parametrize(
    ("this_worker", "warm_worker", "busy", "queued_for_s", "bound_s", "wait_s"),
    [
        ("gpu1", "gpu0", True, 0.0, 0.2, 0.2),  # just queued, its warm GPU busy: leave it for 0.2 s
        ("gpu1", "gpu0", True, 0.15, 0.2, 0.05),  # the rest of the bound
        ("gpu1", "gpu0", True, 0.2, 0.2, 0.0),  # the bound has passed: any GPU takes it
        ("gpu1", "gpu0", True, 5.0, 0.2, 0.0),
        ("gpu1", "gpu0", False, 0.0, 0.2, 0.0),  # its warm GPU is free: it takes it, or this one does
        ("gpu0", "gpu0", True, 0.0, 0.2, 0.0),  # this is its warm GPU
        ("gpu1", "", True, 0.0, 0.2, 0.0),  # warm nowhere (a first start, or restored cold)
        ("gpu1", "gpu0", True, 0.0, 0.0, 0.0),  # affinity off
        ("gpu1", "gpu0", True, -1.0, 0.2, 0.2),  # a clock behind the database's: never more than the bound
    ],
)
def test_a_free_gpu_leaves_a_job_to_its_busy_warm_gpu_only_within_the_bound(
    this_worker, warm_worker, busy, queued_for_s, bound_s, wait_s
):
    got = wait_for_warm_s(
        this_worker=this_worker,
        warm_worker=warm_worker,
        warm_worker_busy=busy,
        queued_for_s=queued_for_s,
        bound_s=bound_s,
    )
    assert got == pytest.approx(wait_s)


def test_the_default_bound_is_a_few_hundred_milliseconds():
    assert 0.05 <= WARM_WAIT_S <= 0.5
