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


# Two GPUs. Under clockq: A and B (BK) run from the start; four new HP jobs at 50 take both GPUs
# from them (H1, H2 until 150) and two wait (H3, H4). The first forecast (60 s) sees the load
# index at 200 % (2 busy + 4 waiting over 2 GPUs): admission closes.
TRACE = Trace(
    "admission",
    [
        job("A", 0, 400, "BK"),
        job("B", 1, 400, "BK"),
        *[job(f"H{i}", 50, 100, "HP") for i in (1, 2, 3, 4)],
        job("C", 70, 10, "SP"),  # would wait anyway: H3 and H4 ask for both GPUs
        job("E", 75, 10, "HP"),  # next in line after H3 and H4: nothing more urgent waits
        job("D", 90, 10, "SP", deadline=100),  # held past its deadline
    ],
)


def run(policy: str, admission: control.Thresholds | None, trace: Trace = TRACE):
    result = replay(trace, policy, Config(gpus=2, switch_cost=FREE, admission=admission))
    return result, {r.job.key: r for r in result.jobs}


def starts(jobs) -> dict[str, float | None]:
    return {key: r.first_start_s for key, r in jobs.items()}


def test_a_closed_admission_holds_only_what_would_wait_anyway_and_costs_it_nothing():
    result, jobs = run("clockq", control.Thresholds())
    _, plain = run("clockq", None)
    # C and D are held (no GPU free, two GPUs of new HP work ahead); E is queued. At 180 s E is
    # all that waits ahead of C: C is queued, still behind the HP jobs, and starts at 250 with
    # E, when H3 and H4 end, as it does without admission control.
    assert result.held_jobs == 2 and result.admission_closures == 1
    assert jobs["C"].first_start_s == 250 and jobs["E"].first_start_s == 250
    assert starts(jobs) == starts(plain)
    assert [r.jct_s for r in result.jobs] == [r.jct_s for r in plain.values()]


def test_holding_all_holds_every_new_job_but_rt_until_admission_reopens():
    result, jobs = run("clockq", control.Thresholds(hold=control.HOLD_ALL))
    # C, D and E are held; the load index stays above 75 % until A and B end at 600 and 611.
    assert result.held_jobs == 3 and result.admission_closures == 1
    assert jobs["C"].first_start_s == 600 and jobs["E"].first_start_s == 600
    assert jobs["C"].wait_s == 530


def test_under_fifo_every_waiting_job_is_ahead_of_a_new_one():
    result, jobs = run("fifo", control.Thresholds())
    # A and B keep their GPUs until 400: C, E and D are held (four HP jobs wait ahead). At 540
    # nothing waits: E and C are queued, by tier, and start when H3 and H4 end.
    assert result.held_jobs == 3
    assert (jobs["E"].first_start_s, jobs["C"].first_start_s) == (600, 601)


def test_rt_is_admitted_while_closed():
    trace = Trace("rt", [*TRACE.jobs, job("R", 80, 5, "RT")])
    result, jobs = run("fifo", control.Thresholds(hold=control.HOLD_ALL), trace)
    # Queued at 80, not held: under fifo no GPU comes free within its 1 s start timeout.
    assert jobs["R"].timed_out and jobs["R"].finish_s == 81 and result.held_jobs == 3


@pytest.mark.parametrize("hold", control.HOLD_MODES)
def test_a_deadline_that_passes_while_held_ends_the_job(hold):
    _, jobs = run("clockq", control.Thresholds(hold=hold))
    assert jobs["D"].timed_out and jobs["D"].finish_s == 100 and jobs["D"].first_start_s is None


def test_without_admission_control_nothing_is_held():
    result, jobs = run("fifo", None)
    assert jobs["C"].first_start_s == 600 and result.held_jobs == 0 and result.admission_closures == 0


@pytest.mark.parametrize(
    ("thresholds", "says"),
    [
        (control.Thresholds(close_above=0.7, reopen_below=0.8), "reopen_below"),
        (control.Thresholds(hold="some"), "hold must be one of"),
    ],
)
def test_bad_thresholds_are_refused(thresholds, says):
    with pytest.raises(ValueError, match=says):
        Config(gpus=2, admission=thresholds)
