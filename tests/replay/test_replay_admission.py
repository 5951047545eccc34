"""Admission control in the replay: the live loop's rules (clockq/policy/control.py) on a
schedule worked out by hand. The traces are written here, not real data."""

from __future__ import annotations

import pytest

from clockq.policy import control
from clockq.replay.config import Config, SwitchCost
from clockq.replay.model import Trace, TraceJob
from clockq.replay.policies import replay

FAR = 1e6
FREE = SwitchCost(fixed_ms=0.0, per_mb_ms=0.0)


def job(key: str, submit: float, duration: float, tier: str, deadline: float = FAR) -> TraceJob:
    return TraceJob(key, 0, submit, duration, 1, tier, deadline, checkpoint_mb=0.0)


# Two GPUs, both busy from the start: the load index is 1.0 at the first forecast (60 s).
TRACE = Trace(
    "admission",
    [
        job("A", 0, 200, "BK"),
        job("B", 1, 200, "BK"),
        job("C", 70, 10, "SP"),  # arrives while admission is closed
        job("R", 80, 5, "RT"),  # RT is always admitted
        job("D", 90, 10, "SP", deadline=100),  # held past its deadline
    ],
)


def run(policy: str, admission: control.Thresholds | None):
    result = replay(TRACE, policy, Config(gpus=2, switch_cost=FREE, admission=admission))
    return result, {r.job.key: r for r in result.jobs}


@pytest.mark.parametrize("policy", ["fifo", "clockq"])
def test_a_closed_admission_holds_new_jobs_until_it_reopens(policy):
    result, jobs = run(policy, control.Thresholds())
    # 60 s: load 2/2 = 100 % > 85 %: closed. 120, 180: still 100 %. A and B end at 200 and
    # 201; at 240 the load is 0 % < 75 %: reopened, and C, held since 70, starts then.
    assert jobs["C"].first_start_s == 240 and jobs["C"].finish_s == 250
    assert jobs["C"].wait_s == 170
    assert result.held_jobs == 2 and result.admission_closures == 1


def test_rt_is_admitted_while_closed():
    _, jobs = run("fifo", control.Thresholds())
    # Queued at 80, not held: under fifo no GPU comes free within its 1 s start timeout.
    assert jobs["R"].timed_out and jobs["R"].finish_s == 81


def test_a_deadline_that_passes_while_held_ends_the_job():
    _, jobs = run("fifo", control.Thresholds())
    assert jobs["D"].timed_out and jobs["D"].finish_s == 100 and jobs["D"].first_start_s is None


def test_without_admission_control_nothing_is_held():
    result, jobs = run("fifo", None)
    assert jobs["C"].first_start_s == 200 and result.held_jobs == 0 and result.admission_closures == 0


def test_thresholds_that_would_flap_are_refused():
    with pytest.raises(ValueError, match="reopen_below"):
        Config(gpus=2, admission=control.Thresholds(close_above=0.7, reopen_below=0.8))
