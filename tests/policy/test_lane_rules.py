"""The RT lane's rules (clockq/policy/lanes.py), as tables."""

from __future__ import annotations

import pytest

from clockq.policy.lanes import LanePath, LaneView, lanes_take_urgent, pause_over, rt_lane_path, service_ms


@pytest.mark.parametrize(
    ("rt_mem", "running_mem", "running", "free", "total", "path"),
    [
        (4096, 8192, False, None, 16384, LanePath.FREE),  # nothing runs: nothing to pause
        (4096, 8192, True, None, 16384, LanePath.PAUSE_IN_PLACE),  # simulated: 16384 - 8192 left
        (8192, 8192, True, None, 16384, LanePath.PAUSE_IN_PLACE),  # exactly fits
        (8193, 8192, True, None, 16384, LanePath.CHECKPOINT),  # one MiB too many
        (None, 8192, True, None, 16384, LanePath.PAUSE_IN_PLACE),  # an RT job that declares nothing
        (1024, None, True, None, 16384, LanePath.CHECKPOINT),  # unknown room beside an undeclared job
        (None, None, True, None, 16384, LanePath.PAUSE_IN_PLACE),  # nothing needed, nothing known
        (1024, 99999, True, 2048, 81920, LanePath.PAUSE_IN_PLACE),  # measured free memory decides
        (4096, 1, True, 2048, 81920, LanePath.CHECKPOINT),  # measured: not enough, whatever was declared
        (1024, None, True, None, None, LanePath.CHECKPOINT),  # no memory known at all
    ],
)
def test_an_rt_job_pauses_the_running_job_only_where_it_surely_fits(rt_mem, running_mem, running, free, total, path):
    view = LaneView(rt_mem_mib=rt_mem, running_mem_mib=running_mem, running=running, free_mib=free, total_mib=total)
    assert rt_lane_path(view) == path


@pytest.mark.parametrize(
    ("running", "free_elsewhere", "path"),
    [
        (True, 1, LanePath.ELSEWHERE),  # a GPU runs nothing: it takes the RT job, nothing pauses
        (True, 0, LanePath.PAUSE_IN_PLACE),  # every GPU busy (or left to them once already)
        (False, 3, LanePath.FREE),  # this GPU runs nothing itself: the lane just runs it
    ],
)
def test_an_rt_job_goes_to_a_gpu_that_runs_nothing_before_any_job_pauses(running, free_elsewhere, path):
    view = LaneView(
        rt_mem_mib=1024, running_mem_mib=1024, running=running, free_mib=None, total_mib=16384,
        free_elsewhere=free_elsewhere,
    )  # fmt: skip
    assert rt_lane_path(view) == path


@pytest.mark.parametrize(
    ("waiting", "idle", "take"),
    [
        ([1, 0, 3, 0, 0], 1, True),  # one RT job, one idle lane
        ([2, 0, 0, 0, 0], 1, False),  # two RT jobs, one lane: one running job makes way
        ([1, 1, 0, 0, 0], 2, False),  # an HP job waits too: the order places it, as without lanes
        ([0, 1, 0, 0, 0], 4, False),  # HP only: lanes take no HP job
        ([1, 0, 0, 0, 0], 0, False),  # no idle lane (or the lane is off)
        ([0, 0, 5, 0, 0], 3, False),  # nothing urgent
    ],
)
def test_running_jobs_leave_no_checkpoint_for_rt_jobs_that_idle_lanes_take(waiting, idle, take):
    assert lanes_take_urgent(waiting, idle) is take


@pytest.mark.parametrize(("paused", "bound", "over"), [(0.0, 2.0, False), (1.99, 2.0, False), (2.0, 2.0, True)])
def test_a_pause_is_bounded(paused, bound, over):
    assert pause_over(paused, bound) is over


@pytest.mark.parametrize(("elapsed", "paused", "served"), [(50.0, 0.0, 50.0), (250.0, 200.0, 50.0), (10.0, 12.0, 0.0)])
def test_a_pause_is_not_service(elapsed, paused, served):
    assert service_ms(elapsed, paused) == served
