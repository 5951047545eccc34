import dataclasses

import pytest

from clockq.policy.slicing import (
    PREEMPTED,
    Boundary,
    BoundaryAction,
    PendingAction,
    decide_at_boundary,
    ewma,
    plan_slice,
    switch_cost_ewma,
)


@dataclasses.dataclass(frozen=True)
class Words:
    """A decision to make way that is only its words (`slicing.MadeWayFor`)."""

    words: str

    def describe(self) -> str:
        return self.words


@pytest.mark.parametrize(
    ("avg_util", "expected_ms"),
    [
        (None, 50),  # no history: the base slice
        (0.0, 40),  # efficiency 0.8
        (0.45, 50),  # 0.8 + 0.4 * 0.5 = 1.0
        (0.9, 60),  # efficiency 1.2
        (1.0, 60),  # capped at 1.2
    ],
)
def test_plan_slice_follows_the_specification_formula(avg_util, expected_ms):
    assert plan_slice(base_ms=50, min_ms=20, avg_util=avg_util).ms == expected_ms


def test_plan_slice_never_goes_below_the_floor():
    assert plan_slice(base_ms=20, min_ms=20, avg_util=0.0).ms == 20
    assert plan_slice(base_ms=10, min_ms=20).ms == 20


@pytest.mark.parametrize(
    ("boundary", "action"),
    [
        (Boundary(done=True), BoundaryAction.FINISH),
        # None of the jobs waiting comes first in the order (an older job of its class keeps its GPU).
        (Boundary(done=False), BoundaryAction.CONTINUE),
        (
            Boundary(done=False, making_way=Words("job #7 (BK, level 0)")),
            BoundaryAction.YIELD,
        ),
        (
            Boundary(done=False, past_deadline=True),
            BoundaryAction.TIME_OUT,
        ),
        (
            Boundary(done=False, pending_action=PendingAction.HOLD),
            BoundaryAction.HOLD,
        ),
        (
            Boundary(done=False, pending_action=PendingAction.REQUEUE),
            BoundaryAction.YIELD,
        ),
        (Boundary(done=False, shutting_down=True), BoundaryAction.YIELD),
    ],
)
def test_decide_at_boundary(boundary, action):
    assert decide_at_boundary(boundary).action == action


@pytest.mark.parametrize(
    ("kwargs", "ms", "reason"),
    [
        ({}, 50, "formula"),  # no history
        ({"avg_util": 0.0}, 40, "formula"),
        ({"avg_util": 0.45}, 50, "formula"),
        ({"avg_util": 0.9}, 60, "formula"),
        ({"avg_util": 1.0}, 60, "formula"),
        ({"base_ms": 20, "avg_util": 0.0}, 20, "floor"),  # 16 ms by the formula
        ({"switch_cost_ms": 2.0}, 50, "formula"),  # 2 ms / 5% = 40 ms: the formula already covers it
        ({"switch_cost_ms": 6.0}, 120, "overhead"),  # 6 ms / 5% = 120 ms
        ({"switch_cost_ms": 6.0, "overhead_budget": 0.1}, 60, "overhead"),
        ({"switch_cost_ms": 1000.0}, 5000, "overhead"),  # capped at max_ms
        ({"switch_cost_ms": 6.0, "overhead_budget": 0.0}, 50, "formula"),  # budget 0 turns the rule off
    ],
)
def test_plan_slice_table(kwargs, ms, reason):
    args = {"base_ms": 50, "min_ms": 20, **kwargs}
    plan = plan_slice(**args)
    assert (plan.ms, plan.reason) == (ms, reason)


def test_ewma_starts_at_the_first_sample_and_moves_towards_new_ones():
    assert ewma(None, 0.5) == 0.5
    assert ewma(0.5, 1.0) == pytest.approx(0.65)


def test_a_single_stalled_switch_moves_the_estimate_a_little_and_a_lasting_rise_fully():
    assert switch_cost_ewma(None, 200.0) == 200.0  # the first sample starts it
    assert switch_cost_ewma(10.0, 200.0) == pytest.approx(16.0)  # counted as 30 ms, not 200
    assert switch_cost_ewma(10.0, 12.0) == pytest.approx(10.6)  # ordinary samples as ewma
    estimate = 10.0
    for _ in range(8):  # the job's checkpoint grew: each switch now costs 100 ms
        estimate = switch_cost_ewma(estimate, 100.0)
    assert estimate > 90.0


def test_a_slice_cut_short_yields_only_to_the_job_the_order_names():
    # An urgent job was announced; the order named this job to make way for it, or did not (a
    # free GPU took it, or another GPU's job is the victim).
    named = decide_at_boundary(Boundary(done=False, making_way=Words("job #9 (RT, service level 0)"), cut_short=True))
    assert named.action == BoundaryAction.YIELD
    assert named.reason == f"{PREEMPTED}: made way for job #9 (RT, service level 0), which comes first in the order"
    assert decide_at_boundary(Boundary(done=False, cut_short=True)).action == BoundaryAction.CONTINUE


def test_plan_slice_takes_keyword_arguments_only():
    with pytest.raises(TypeError):
        plan_slice(50, 20)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("boundary", "action"),
    [
        # Making way for a job of the same tier, a higher one or an RT job would lose the work.
        (
            Boundary(done=False, making_way=Words("job #7")),
            BoundaryAction.CONTINUE,
        ),
        (
            Boundary(done=False, making_way=Words("job #8 (RT, service level 0)"), cut_short=True),
            BoundaryAction.CONTINUE,
        ),
        # What a deadline, an operator or a stopping worker asks for still happens.
        (Boundary(done=True), BoundaryAction.FINISH),
        (Boundary(done=False, past_deadline=True), BoundaryAction.TIME_OUT),
        (
            Boundary(done=False, pending_action=PendingAction.REQUEUE),
            BoundaryAction.YIELD,
        ),
        (Boundary(done=False, shutting_down=True), BoundaryAction.YIELD),
    ],
)
def test_a_job_makes_way_for_no_one_while_its_checkpoints_cannot_be_written(boundary, action):
    failing = dataclasses.replace(boundary, checkpoints_failing=True)
    assert decide_at_boundary(failing).action == action
