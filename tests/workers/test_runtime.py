"""What a worker process keeps between tasks: the fixed part of a switch, and its tier cache."""

from __future__ import annotations

import pytest

from clockq.jobs.models import QueueTier
from workers.runtime import Runtime, TierCache, TierMismatch, WorkerIdentity


def test_switch_overhead_is_the_gpu_idle_gap_less_checkpoint_and_restore():
    runtime = Runtime(WorkerIdentity("gpu0@test", 0))
    runtime.last_yield = (100.000, 2.0)  # the yielding job's last step ended at t=100 s; 2 ms checkpoint

    runtime.note_switch_in(first_step_at=100.010, restore_ms=1.0)  # 10 ms of GPU idle time

    assert abs(runtime.switch_overhead_ms - 7.0) < 1e-6
    assert runtime.last_yield is None  # measured once per switch


def test_a_long_idle_gap_is_not_counted_as_a_switch():
    runtime = Runtime(WorkerIdentity("gpu0@test", 0))
    runtime.last_yield = (100.0, 2.0)
    runtime.note_switch_in(first_step_at=105.0, restore_ms=1.0)  # the GPU sat idle for 5 s
    assert runtime.switch_overhead_ms is None


def test_without_a_previous_yield_nothing_is_measured():
    runtime = Runtime(WorkerIdentity("gpu0@test", 0))
    runtime.note_switch_in(first_step_at=100.0, restore_ms=1.0)
    assert runtime.switch_overhead_ms is None


@pytest.mark.django_db
def test_the_tier_cache_reads_the_rows_settings_and_refuses_rows_that_disagree_with_the_definition():
    sp = QueueTier.objects.get(code="SP")
    sp.base_slice_ms = 120
    sp.save()
    assert TierCache().get(sp.pk).base_slice_ms == 120  # an operator's setting
    QueueTier.objects.filter(code="BK").update(code="XX")
    with pytest.raises(TierMismatch, match=r"a row for tier 'XX', which is not defined.*; no row for tier BK"):
        TierCache().get(sp.pk)
