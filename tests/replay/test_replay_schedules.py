"""The replay engine against schedules worked out by hand, and proof that it runs clockq/policy.

The traces here are generated (written in the test), not real data.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from clockq.policy import ordering, promotion, service_levels, slicing
from clockq.policy.tiers import TIERS
from clockq.replay.config import Config, SwitchCost
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
    config = {"gpus": 1, "switch_cost": FREE, **config}
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


def test_clockq_orders_by_service_and_tier_and_promotes_the_starved():
    # Every job here stays on the first rung of its tier's service ladder (all are far below
    # 300 GPU-s), so the order is the tier's; no switch costs, so a victim leaves at once.
    #  0   A (BK) alone.
    #  10  B (SP) comes before A: A makes way (it has had its 50 ms slice). B runs.
    #  20  C (HP) interrupts B (HP and RT do not wait for a slice to end). C runs.
    #  32  D (RT) interrupts C; D runs 32-42.
    #  42  C (HP, 23 s left) comes first again, runs 42-65.
    #  B waits in SP through three promotion rounds in which other jobs ran, and goes up to HP,
    #  where it waits behind C, which is HP's own (a promoted job never displaces one).
    #  65  B (promoted, 10 s left) runs to 75.
    #  75  A and E (BK, both on level 0): A was submitted first and keeps its place. No turns:
    #      A runs to its end at 165, then E to 215.
    result, jobs = run("clockq")
    assert result.start_order == ["A", "B", "C", "D", "E"]
    assert times(jobs, "first_start_s") == pytest.approx({"A": 0, "B": 10, "C": 20, "D": 32, "E": 165})
    assert times(jobs, "finish_s") == pytest.approx({"A": 165, "B": 75, "C": 65, "D": 42, "E": 215})
    assert times(jobs, "promotions") == {"A": 0, "B": 1, "C": 0, "D": 0, "E": 0}
    assert times(jobs, "preemptions") == {"A": 1, "B": 1, "C": 1, "D": 0, "E": 0}
    assert not any(r.timed_out for r in result.jobs)
    assert result.busy_gpu_s == pytest.approx(215)


def test_a_long_job_sinks_a_level_and_is_passed_once_not_in_turns():
    # Two BK jobs of 1,000 s with 100 MB of state on one GPU (BK: no promotion to stir the
    # order). A runs first; once it has had the first rung of BK's ladder, B (on level 0)
    # comes before it and A makes way, paying its switch. B then sinks to A's level too, but
    # within a level nobody is displaced: B runs to its end and A resumes. One switch in all,
    # where taking turns would switch every slice.
    heavy = [replace(job(k, 0, 1000, "BK"), checkpoint_mb=100.0) for k in "AB"]
    result, jobs = run("clockq", Trace("pair", heavy), switch_cost=SwitchCost())
    rung = ordering.DEFAULT_LADDER.rungs(ordering_rank("BK"))[0]
    switch = 0.0095 + 0.0012 * 100
    assert times(jobs, "preemptions") == {"A": 1, "B": 0}
    assert jobs["B"].first_start_s == pytest.approx(rung + switch)
    assert jobs["B"].finish_s == pytest.approx(rung + switch + 1000)
    assert jobs["A"].finish_s == pytest.approx(2000 + switch)
    assert result.switch_gpu_s == pytest.approx(switch)


def test_a_promotion_keeps_the_jobs_service_and_makes_it_new_to_nobody():
    # One GPU. A (SP, long) runs and passes the first rung of SP's ladder; then B (BK, new, on
    # level 0, shorter than a rung) comes before it, and A makes way. A then skips promotion
    # rounds and goes up to HP, but with its service: on HP's ladder it is past the first rung
    # too, so it does not come before B, which is new. B runs to its end undisturbed, then A
    # resumes. (A promotion that counted service afresh made A new in HP, and it took the GPU
    # back from B at once.)
    trace = Trace("promoted", [job("A", 0, 5000, "SP"), job("B", 1000, 200, "BK")])
    _, jobs = run("clockq", trace)
    assert ordering.DEFAULT_LADDER.rungs(ordering_rank("HP"))[0] < 1000
    assert times(jobs, "preemptions") == {"A": 1, "B": 0}
    assert jobs["A"].promotions == 1
    assert jobs["B"].first_start_s == pytest.approx(1000)
    assert jobs["B"].finish_s == pytest.approx(1200)
    assert jobs["A"].finish_s == pytest.approx(5200)


def test_a_user_with_one_job_goes_before_the_rest_of_a_busy_users_queue():
    # One GPU. The heavy user's three jobs are queued first, the light user's one a second later;
    # all stay on the first rung (one class). When the first heavy job ends, the heavy user has
    # had 100 s of service and the light user none: the light job goes next, though the heavy
    # jobs were queued before it, when their user had had no service yet.
    heavy = [replace(job(f"H{i}", 0, 100, "BK"), user="heavy") for i in range(3)]
    trace = Trace("users", [*heavy, replace(job("L", 1, 100, "BK"), user="light")])
    result, jobs = run("clockq", trace)
    assert result.start_order == ["H0", "L", "H1", "H2"]
    assert jobs["L"].first_start_s == pytest.approx(100)


def ordering_rank(code: str) -> int:
    return next(t.rank for t in TIERS if t.code == code)


def test_the_replay_runs_on_the_ladder_it_is_given():
    # The same pair on a ladder whose first rung is 100 GPU-s (CLOCKQ_SERVICE_LADDER_S=100,8000
    # live): A makes way for B once it has had 100 s, not BK's default 300.
    pair = Trace("pair", [job(k, 0, 1000, "BK") for k in "AB"])
    _, jobs = run("clockq", pair, ladder=ordering.Ladder(base_gpu_s=(100.0, 8000.0)))
    assert jobs["B"].first_start_s == pytest.approx(100.0)
    assert times(jobs, "preemptions") == {"A": 1, "B": 0}


@pytest.mark.parametrize(
    ("ladder", "message"),
    [
        ((100.0, 800.0), "must be an ordering.Ladder"),
        (ordering.Ladder(tiers=3), "for 3 tiers, the replay has 5"),
    ],
)
def test_a_replay_refuses_a_ladder_that_is_not_one_for_its_tiers(ladder, message):
    with pytest.raises(ValueError, match=message):
        Config(gpus=1, ladder=ladder)


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
    # 2 GPUs. X needs both; Y (HP, one GPU) interrupts it at 1. X then waits for two free
    # GPUs: the second GPU stays idle while Y runs (nothing else waits to use it), and X
    # resumes on both at 6 with 9 s of work left.
    trace = Trace("gang", [job("X", 0, 10, "BK", gpus=2), job("Y", 1, 5, "HP")])
    result, jobs = run("clockq", trace, gpus=2)
    assert jobs["Y"].first_start_s == pytest.approx(1.0)
    assert jobs["X"].finish_s == pytest.approx(15.0)
    assert jobs["X"].preemptions == 1
    assert result.busy_gpu_s == pytest.approx(2 * 10 + 5)
    # X waited from 1 to 6 with one GPU held.
    assert result.waiting_s == pytest.approx(5.0)
    assert result.held_while_waiting_gpu_s == pytest.approx(5 * 1)


def test_jobs_behind_a_gang_that_does_not_fit_use_the_free_gpus_meanwhile():
    # 2 GPUs. H (HP) holds one until 10; G (SP gang of 2) waits for both; S (BK, 4 s) comes
    # after G in the order but fits in the free GPU, and would make way for G: it backfills at
    # 2 and ends at 6, before H leaves. G starts at 10 on both GPUs.
    trace = Trace("backfill", [job("H", 0, 10, "HP"), job("G", 1, 5, "SP", gpus=2), job("S", 2, 4, "BK")])
    _, jobs = run("clockq", trace, gpus=2)
    assert times(jobs, "first_start_s") == pytest.approx({"H": 0, "G": 10, "S": 2})
    assert times(jobs, "finish_s") == pytest.approx({"H": 10, "G": 15, "S": 6})


def test_a_job_past_its_deadline_times_out_under_every_policy():
    trace = Trace("late", [job("A", 0, 100, "SP", deadline=50.0), job("B", 1, 10, "SP", deadline=5.0)])
    for policy in ("fifo", "priority", "las", "clockq"):
        _, jobs = run(policy, trace)
        assert jobs["A"].timed_out and jobs["A"].finish_s == pytest.approx(50.0), policy
        assert jobs["B"].timed_out, policy


# --- the replay runs clockq/policy -------------------------------------------------------------

# The functions the live system runs too ...
SHARED_WITH_LIVE = [
    (slicing, "plan_slice"),
    (promotion, "decide_round"),
    (promotion, "batch_chance"),
    (service_levels, "judge_wait"),
]
# ... and the order, which the live worker's claim and boundary reach through clockq/jobs/order.py
# (pick_next; makes_way_for, which walks pick_victim by victim_key; share_weight).
ORDER = [
    (ordering, "order_key"),
    (ordering, "pick_next"),
    (ordering, "pick_victim"),
    (ordering, "leaves_at"),
    (ordering, "interrupts"),
    (ordering, "victim_key"),
    (ordering, "may_backfill"),
    (ordering, "share_weight"),
]


def test_the_workers_and_beat_call_the_same_policy_functions():
    from clockq.jobs import order as live_order
    from clockq.jobs import promotion as live_promotion
    from clockq.kpis import rollup as kpi_rollup
    from workers.run import boundary, claim, steps

    assert steps.plan_slice is slicing.plan_slice
    assert boundary.decide_at_boundary is slicing.decide_at_boundary
    assert boundary.order is claim.order is live_order and live_order.ordering is ordering
    assert claim.judge_wait is service_levels.judge_wait
    assert live_promotion.rules is promotion  # promotion_tick and batch chances: rules.decide_round ...
    assert kpi_rollup.finished_on_time is service_levels.finished_on_time


def test_the_replay_calls_those_functions(monkeypatch):
    calls: Counter[str] = Counter()
    for module, name in SHARED_WITH_LIVE + ORDER:
        original = getattr(module, name)

        def spy(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    # FIVE, a BP job for the batch chance, and a gang on a second GPU for the backfill.
    trace = Trace("mix", [*FIVE.jobs, job("P", 41, 30, "BP"), job("G", 45, 5, "SP", gpus=2), job("S", 46, 1, "BK")])
    run("clockq", trace, gpus=2, batch_chance_every_s=60.0)
    assert set(calls) == {name for _, name in SHARED_WITH_LIVE + ORDER}, calls


def test_the_replay_orders_waiting_jobs_by_the_policys_order_key(monkeypatch):
    # Given one GPU held by A while B, C and D (all of one tier and level) arrive
    trace = Trace("queue", [job("A", 0, 10, "BK"), job("B", 1, 1, "BK"), job("C", 2, 1, "BK"), job("D", 3, 1, "BK")])
    assert run("clockq", trace)[0].start_order == ["A", "B", "C", "D"]  # the first submitted first
    # When the policy's key puts the last submitted first
    original = ordering.order_key
    monkeypatch.setattr(ordering, "order_key", lambda s, **kw: (*original(s, **kw)[:4], -s.submitted, s.job_id))
    # Then the replay follows it: its order comes from ordering.order_key, not a rule of its own
    assert run("clockq", trace)[0].start_order == ["A", "D", "C", "B"]


def test_changing_the_policy_changes_the_replay(monkeypatch):
    # A policy under which nobody makes way turns clockq into run-to-completion: the replay
    # follows whatever clockq/policy decides. D (RT) then times out waiting behind A.
    before, _ = run("clockq")
    monkeypatch.setattr(ordering, "may_displace", lambda waiting, running: False)
    after, jobs = run("clockq")
    assert after.start_order != before.start_order
    assert times(jobs, "preemptions") == {"A": 0, "B": 0, "C": 0, "D": 0, "E": 0}
    assert jobs["D"].timed_out
