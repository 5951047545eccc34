"""Slice length follows measured GPU utilisation, and is stretched when switching is costly."""

from __future__ import annotations

import pytest

from tests.helpers import submit, wait_finished

pytestmark = pytest.mark.integration


def test_a_low_utilisation_job_gets_shorter_slices_than_a_high_one(start_workers, alice):
    start_workers(gpus=2)
    low = submit(alice, "SP", "low", steps=40, step_ms=10, gpu_util=0.2)
    high = submit(alice, "SP", "high", steps=40, step_ms=10, gpu_util=0.95)
    low, high = wait_finished(low, high)

    def later_plans(job):
        # The first slice has no history and runs the tier's base; later ones follow the rule.
        return list(job.slices.order_by("started_at").values_list("planned_ms", "plan_reason", "gpu_util"))[1:]

    low_plans, high_plans = later_plans(low), later_plans(high)
    assert low_plans and high_plans
    # 0.8 + 0.4 * (0.2 / 0.9) of 50 ms is 44 ms; 0.95 is above 0.9, so 1.2 * 50 = 60 ms.
    assert {ms for ms, _, _ in low_plans} == {44}
    assert {ms for ms, _, _ in high_plans} == {60}
    assert {reason for _, reason, _ in low_plans + high_plans} == {"formula"}
    assert all(abs(util - 0.2) < 1e-6 for _, _, util in low_plans)
    assert low.util_ewma == pytest.approx(0.2) and high.util_ewma == pytest.approx(0.95)


def test_a_job_with_a_heavy_checkpoint_gets_its_slices_stretched(start_workers, alice):
    # No room for snapshots in host memory, so each checkpoint is written before the GPU is handed
    # over and each resume reads it back. (With room, a heavy job costs a switch little more than
    # a light one: its snapshot is copied out and written in the background, and it resumes warm.)
    start_workers(gpus=1, CLOCKQ_OVERHEAD_BUDGET="0.05", CLOCKQ_SNAPSHOT_MEMORY_MB="1", CLOCKQ_WARM_CACHE_JOBS="0")
    heavy = submit(alice, "SP", "heavy", steps=150, step_ms=5, state_kb=32 * 1024)  # 32 MB of state
    light = submit(alice, "SP", "light", steps=150, step_ms=5, state_kb=1)
    heavy, light = wait_finished(heavy, light, timeout=90)

    assert heavy.switch_cost_ms and heavy.switch_cost_ms > light.switch_cost_ms
    stretched = heavy.slices.filter(plan_reason="overhead")
    assert stretched.exists()
    # Never shorter than switch cost / 5%, and well above the 50 ms base.
    assert min(stretched.values_list("planned_ms", flat=True)) > 100
