"""The replay engine against schedules worked out by hand, and proof that it runs the live policy.

The traces here are generated (written in the test), not real data.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from clockq.policy import promotion, service_levels, slicing
from clockq.replay.engine import Config, SwitchCost
from clockq.replay.model import Trace, TraceJob
from clockq.replay.policies import replay

FAR = 1e6  # a deadline nobody reaches
FREE = SwitchCost(fixed_ms=0.0, per_mb_ms=0.0)  # switches cost nothing: the arithmetic stays simple


def job(key: str, submit: float, duration: float, tier: str, gpus: int = 1, deadline: float | None = FAR) -> TraceJob:
    return TraceJob(key, 0, submit, duration, gpus, tier, deadline, checkpoint_mb=0.0)


# One GPU, five jobs: a long BK job, then SP, HP, RT and BK work arriving while it runs.
FIVE = Trace(
    "five",
    [
        job("A", 0, 100, "BK"),
        job("B", 10, 20, "SP"),
        job("C", 20, 35, "HP"),
        job("D", 32, 10, "RT"),
        job("E", 40, 50, "BK"),
    ],
)


def run(policy: str, trace: Trace = FIVE, **config):
    config = {"gpus": 1, "quantum_s": 10.0, "switch_cost": FREE, **config}
    result = replay(trace, policy, Config(**config))
    return result, {r.job.key: r for r in result.jobs}


def times(by_key, attr):
    return {k: getattr(r, attr) for k, r in by_key.items()}


def test_fifo_runs_each_job_to_completion_in_submission_order():
    result, jobs = run("fifo")
    # A 0-100, B 100-120, C 120-155, E 155-205. D (RT) is not started within its tier's 1 s
    # start timeout: it times out at 33, having waited 1 s.
    assert result.start_order == ["A", "B", "C", "E"]
    assert times(jobs, "first_start_s") == {"A": 0, "B": 100, "C": 120, "D": None, "E": 155}
    assert times(jobs, "finish_s") == {"A": 100, "B": 120, "C": 155, "D": 33, "E": 205}
    assert jobs["D"].timed_out and jobs["D"].wait_s is None
    assert result.busy_gpu_s == pytest.approx(205) and result.switch_gpu_s == 0


def test_priority_is_strict_tier_order_without_preemption():
    result, jobs = run("priority")
    # A holds the GPU until 100 (no preemption); then HP C, SP B, BK E. D times out at 33.
    assert result.start_order == ["A", "C", "B", "E"]
    assert times(jobs, "finish_s") == {"A": 100, "C": 135, "B": 155, "D": 33, "E": 205}


def test_las_preempts_by_attained_service():
    result, jobs = run("las", las_thresholds_gpu_s=(25.0,), las_starve_knob=1000.0)
    # Two queues split at 25 GPU-seconds; earliest submitted first within a queue.
    # 0: A starts. 25: A has 25 GPU-s, drops a queue, and B (queue 0) preempts it.
    # 32: D (RT) waits behind B and C in queue 0 and times out at 33 (LAS knows no tiers).
    # 45: B finishes (20 s), C starts. 70: C drops a queue, E (queue 0) preempts it.
    # 95: E drops to queue 1, where A (submitted first) waits, but equals do not preempt.
    # 120: E finishes; A (75 s left) runs to 195; then C (10 s left) to 205.
    assert result.start_order == ["A", "B", "C", "E"]
    assert times(jobs, "first_start_s") == {"A": 0, "B": 25, "C": 45, "D": None, "E": 70}
    assert times(jobs, "finish_s") == {"A": 195, "B": 45, "C": 205, "D": 33, "E": 120}
    assert times(jobs, "preemptions") == {"A": 1, "B": 0, "C": 1, "D": 0, "E": 0}


def test_clockq_slices_preempts_for_rt_and_promotes_the_starved():
    result, jobs = run("clockq")
    # No switch cost, no utilisation known: the live slice S is the tier's base, 50 ms.
    #  0     A (BK) alone: it runs on without switching.
    #  10    B (SP) waits; A reads the queue at its next live boundary, 10.05, and yields. B runs alone.
    #  20    C (HP) waits; B yields at 20.05. C runs alone.
    #  32    D (RT) cuts C short at once (no switch cost): D runs 32-42.
    #  42    C (HP, 23.05 s left) is next and runs alone.
    #  40-60 B waits in SP through the rounds ending at 40, 50 and 60 (each tick saw a slice
    #        start or a running job): skipped 3 times, the 60 s tick promotes it to HP.
    #  60.05 C reads the queue and yields to B; B runs one live slice in HP and goes home at
    #        60.10, where C (HP) waiting ahead of it makes it yield. C finishes at 65.10.
    #  65.10 B (9.95 s left) runs alone to 75.05.
    #  75.05 A and E (BK) take turns in 10 s quanta: E finishes at 175.05, A at 215.
    assert result.start_order == ["A", "B", "C", "D", "E"]
    assert times(jobs, "first_start_s") == pytest.approx({"A": 0, "B": 10.05, "C": 20.05, "D": 32, "E": 85.05})
    assert times(jobs, "finish_s") == pytest.approx({"A": 215, "B": 75.05, "C": 65.10, "D": 42, "E": 175.05})
    assert times(jobs, "promotions") == {"A": 0, "B": 1, "C": 0, "D": 0, "E": 0}
    assert times(jobs, "preemptions") == {"A": 6, "B": 2, "C": 2, "D": 0, "E": 4}
    assert not any(r.timed_out for r in result.jobs)
    assert result.busy_gpu_s == pytest.approx(215)


def test_clockq_pays_the_switch_cost_of_the_job_that_makes_way():
    # 1 GPU; a 100 MB BK job is cut short by an RT job: the RT job starts once the BK job's
    # switch (10 ms fixed + 100 MB x 1 ms) is paid, and the GPU time is counted as switching.
    trace = Trace("rt", [replace(job("A", 0, 50, "BK"), checkpoint_mb=100.0), job("R", 5, 1, "RT")])
    result, jobs = run("clockq", trace, switch_cost=SwitchCost(fixed_ms=10.0, per_mb_ms=1.0))
    assert jobs["R"].first_start_s == pytest.approx(5.11)
    assert jobs["R"].finish_s == pytest.approx(6.11)
    assert result.switch_gpu_s == pytest.approx(0.11)
    assert jobs["A"].finish_s == pytest.approx(6.11 + 45)


def test_a_gang_holds_all_its_gpus_and_gives_them_back_together():
    # 2 GPUs. X needs both; Y (HP, one GPU) makes X yield at its next live boundary (1.05).
    # X then waits for two free GPUs: the second GPU stays idle while Y runs (strict order, no
    # backfill), and X resumes on both at 6.05 with 8.95 s of work left.
    trace = Trace("gang", [job("X", 0, 10, "BK", gpus=2), job("Y", 1, 5, "HP")])
    result, jobs = run("clockq", trace, gpus=2)
    assert jobs["Y"].first_start_s == pytest.approx(1.05)
    assert jobs["X"].finish_s == pytest.approx(15.0)
    assert jobs["X"].preemptions == 1
    assert result.busy_gpu_s == pytest.approx(2 * 10 + 5)
    # Someone waited from 1 to 6.05: Y for 0.05 s with both GPUs held, then X for 5 s with one.
    assert result.waiting_s == pytest.approx(5.05)
    assert result.held_while_waiting_gpu_s == pytest.approx(0.05 * 2 + 5 * 1)


def test_a_job_past_its_deadline_times_out_under_every_policy():
    trace = Trace("late", [job("A", 0, 100, "SP", deadline=50.0), job("B", 1, 10, "SP", deadline=5.0)])
    for policy in ("fifo", "priority", "las", "clockq"):
        _, jobs = run(policy, trace)
        assert jobs["A"].timed_out and jobs["A"].finish_s == pytest.approx(50.0), policy
        assert jobs["B"].timed_out, policy


def test_time_sharing_costs_what_the_live_overhead_rule_allows():
    # Two SP jobs with 100 MB of state share one GPU. Switch C = 9.5 + 1.2 x 100 = 129.5 ms;
    # the live planner stretches the slice so that switching stays within 5 %: S = C / 0.05 =
    # 2.59 s; taking turns, each second of GPU holds S / (S + C) of work.
    heavy = [replace(job(k, 0, 100, "SP"), checkpoint_mb=100.0) for k in "AB"]
    result, _ = run("clockq", Trace("pair", heavy), switch_cost=SwitchCost())
    c, s = 0.1295, 2.59
    assert result.switch_gpu_s / (result.busy_gpu_s + result.switch_gpu_s) == pytest.approx(c / (s + c), rel=0.05)


# --- the replay runs the live policy ---------------------------------------------------------

LIVE_POLICY = [
    (slicing, "plan_slice"),
    (slicing, "decide_at_boundary"),
    (slicing, "waiting_ahead"),
    (promotion, "decide_round"),
    (promotion, "batch_chance"),
    (service_levels, "judge_wait"),
]


def test_the_workers_and_beat_call_the_same_policy_functions():
    from clockq.jobs import promotion as live_promotion
    from clockq.kpis import rollup as kpi_rollup
    from workers.run import boundary, claim, steps

    assert steps.plan_slice is slicing.plan_slice
    assert boundary.decide_at_boundary is slicing.decide_at_boundary
    assert boundary.waiting_ahead is slicing.waiting_ahead
    assert claim.judge_wait is service_levels.judge_wait
    assert live_promotion.rules is promotion  # promotion_tick and batch chances: rules.decide_round ...
    assert kpi_rollup.finished_on_time is service_levels.finished_on_time


def test_the_replay_calls_those_functions(monkeypatch):
    calls: Counter[str] = Counter()
    for module, name in LIVE_POLICY:
        original = getattr(module, name)

        def spy(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    trace = Trace("mix", [*FIVE.jobs, job("P", 41, 30, "BP")])
    run("clockq", trace, batch_chance_every_s=60.0)
    assert set(calls) == {name for _, name in LIVE_POLICY}, calls


def test_changing_the_policy_changes_the_replay(monkeypatch):
    # A policy that never yields (only finishes or continues) turns clockq into run-to-completion
    # apart from RT preemption: the replay follows whatever clockq/policy decides.
    before, _ = run("clockq")

    def never_yield(b: slicing.Boundary) -> slicing.Decision:
        if b.done:
            return slicing.Decision(slicing.BoundaryAction.FINISH, "done")
        if b.cut_short:
            return slicing.Decision(slicing.BoundaryAction.YIELD, "rt")
        return slicing.Decision(slicing.BoundaryAction.CONTINUE, "never yields")

    monkeypatch.setattr(slicing, "decide_at_boundary", never_yield)
    after, jobs = run("clockq")
    assert after.start_order != before.start_order
    # Only D's RT interrupt moves anyone: A, running when D arrives, makes way once.
    assert times(jobs, "preemptions") == {"A": 1, "B": 0, "C": 0, "D": 0, "E": 0}
