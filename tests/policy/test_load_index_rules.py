"""The load index and the per-host summary, as tables."""

from __future__ import annotations

import pytest

from clockq.policy.load import CAP, GpuReading, cluster_load, host_loads, load_index, mean


@pytest.mark.parametrize(
    ("busy", "waiting", "gpus", "expected"),
    [
        (0, 0, 4, 0.0),  # idle
        (2, 0, 4, 0.5),  # half the GPUs busy, nothing waiting
        (4, 0, 4, 1.0),  # every GPU spoken for
        (4, 2, 4, 1.5),  # half as much again waiting
        (3, 1, 8, 0.5),
        (4, 4, 4, 2.0),  # exactly the cap
        (4, 400, 4, CAP),  # a huge queue cannot blow up the scale
        (0, 9, 3, CAP),
        (5, 0, 4, 1.25),  # a running job whose worker's heartbeat lapsed still counts
        (0, 0, 0, None),  # no GPU worker alive: capacity unknown
        (3, 7, 0, None),
    ],
)
def test_load_index_is_demand_over_capacity_clamped(busy, waiting, gpus, expected):
    assert load_index(busy, waiting, gpus) == expected


def test_the_cap_can_be_chosen():
    assert load_index(4, 4, 4, cap=1.2) == 1.2
    assert load_index(1, 0, 4, cap=1.2) == 0.25


@pytest.mark.parametrize(
    "args",
    [(-1, 0, 4), (0, -1, 4), (0, 0, -1), (1.5, 0, 4), (True, 0, 4), (0, 0, "4"), (0, 0, None)],
)
def test_load_index_refuses_what_is_not_a_count(args):
    with pytest.raises(ValueError):
        load_index(*args)


@pytest.mark.parametrize("cap", [0, -1, float("inf"), float("nan")])
def test_load_index_refuses_a_bad_cap(cap):
    with pytest.raises(ValueError):
        load_index(1, 1, 2, cap=cap)


@pytest.mark.parametrize(
    ("values", "expected"),
    [([], None), ([None, None], None), ([0.5], 0.5), ([0.2, None, 0.4], pytest.approx(0.3))],
)
def test_mean_of_the_known_values(values, expected):
    assert mean(values) == expected


def test_host_loads_average_gpus_and_take_each_hosts_newest_cpu_and_memory():
    readings = [
        GpuReading("hostA", 0.8, 0.10, 0.50, ts=100.0),
        GpuReading("hostA", 0.4, 0.30, 0.60, ts=105.0),  # newest on hostA
        GpuReading("hostA", None, None, None, ts=106.0),  # a GPU whose reading failed
        GpuReading("hostB", 0.0, None, 0.20, ts=90.0),
    ]
    hosts = host_loads(readings, busy_by_host={"hostA": 2, "hostC": 1}, gpus_by_host={"hostA": 3, "hostB": 1})

    assert [(h.host, h.gpus, h.gpu_util, h.cpu, h.memory, h.busy) for h in hosts] == [
        ("hostA", 3, pytest.approx(0.6), 0.30, 0.60, 2),
        ("hostB", 1, 0.0, None, 0.20, 0),
        ("hostC", 0, None, None, None, 1),  # runs a job, sends nothing
    ]
    assert hosts[1].as_dict() == {"gpus": 1, "gpu_util": 0.0, "cpu": None, "memory": 0.2, "busy": 0}

    # GPU utilisation over GPUs (hostA's two readings and hostB's one); CPU and memory over hosts
    cluster = cluster_load(readings, hosts)
    assert cluster.gpu_util == pytest.approx((0.8 + 0.4 + 0.0) / 3)
    assert cluster.cpu == pytest.approx(0.30)
    assert cluster.memory == pytest.approx((0.60 + 0.20) / 2)


def test_without_heartbeats_a_hosts_gpus_are_those_that_report():
    hosts = host_loads([GpuReading("h", 0.5, 0.1, 0.1, 1.0), GpuReading("h", 0.7, 0.1, 0.1, 2.0)])
    assert [(h.host, h.gpus) for h in hosts] == [("h", 2)]


def test_nothing_known_gives_nothing():
    assert host_loads([]) == []
    assert cluster_load([], []) == cluster_load([], [])
    assert cluster_load([], []).gpu_util is None
