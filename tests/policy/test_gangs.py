"""Which GPUs a gang gets, and how many it may ask for (clockq/policy/gangs.py)."""

from __future__ import annotations

import itertools

import pytest

from clockq.policy.gangs import hosts_of, place, size_problem


def workers(host: str, n: int) -> list[str]:
    return [f"gpu{i}@{host}" for i in range(n)]


def test_a_gang_that_fits_one_host_takes_the_one_with_the_fewest_free_gpus():
    free = {"a": workers("a", 4), "b": workers("b", 2), "c": workers("c", 3)}
    seats = place(2, free)
    assert [s.worker for s in seats] == ["gpu0@b", "gpu1@b"]  # a and c stay whole for bigger gangs
    assert [(s.rank, s.local_rank, s.local_world_size) for s in seats] == [(0, 0, 2), (1, 1, 2)]


def test_a_gang_too_big_for_any_host_spreads_over_the_fewest_hosts():
    free = {"a": workers("a", 3), "b": workers("b", 1), "c": workers("c", 2), "d": workers("d", 2)}
    seats = place(5, free)
    assert hosts_of(seats) == ["a", "c"]  # 3 + 2: two hosts; the last one the best fit for 2
    assert [s.rank for s in seats] == [0, 1, 2, 3, 4]
    assert [(s.host, s.local_rank, s.local_world_size) for s in seats] == [
        ("a", 0, 3), ("a", 1, 3), ("a", 2, 3), ("c", 0, 2), ("c", 1, 2),
    ]  # fmt: skip


def test_a_gang_never_starts_on_part_of_its_gpus():
    assert place(4, {"a": workers("a", 2), "b": workers("b", 1)}) is None
    assert place(1, {}) is None
    assert place(0, {"a": workers("a", 2)}) is None


@pytest.mark.parametrize("sizes", [(1, 2, 3), (4, 4), (2, 2, 2, 1), (8,), (3, 1, 1, 1, 5)])
def test_the_hosts_chosen_are_the_fewest_possible_and_every_seat_is_a_free_worker_once(sizes):
    free = {f"h{i}": workers(f"h{i}", n) for i, n in enumerate(sizes)}
    for gpus in range(1, sum(sizes) + 1):
        seats = place(gpus, free)
        assert seats is not None and len(seats) == gpus
        names = [s.worker for s in seats]
        assert len(set(names)) == gpus and all(s.worker in free[s.host] for s in seats)
        fewest = min(
            k for k in range(1, len(sizes) + 1) if any(sum(c) >= gpus for c in itertools.combinations(sizes, k))
        )
        assert len(hosts_of(seats)) == fewest


def test_the_size_asked_for_is_checked_against_the_cluster_and_what_its_workers_run():
    assert size_problem(4, cluster_gpus=8, largest_runnable=8) is None
    assert size_problem(9, cluster_gpus=8, largest_runnable=8) == (
        "9 GPUs asked for; this cluster has 8, the largest job it can run"
    )
    assert size_problem(2, cluster_gpus=8, largest_runnable=1) == (
        "2 GPUs asked for; this cluster's GPU workers run jobs of at most 1 GPU (it has 8)"
    )
    assert size_problem(1, cluster_gpus=0, largest_runnable=1) is None  # waits for its first worker
    assert "no GPU workers registered yet" in size_problem(2, cluster_gpus=0, largest_runnable=8)
    for bad, why in ((0, "at least 1"), (-3, "at least 1"), (True, "whole number"), (2.5, "whole number")):
        assert why in size_problem(bad, cluster_gpus=8, largest_runnable=8)
