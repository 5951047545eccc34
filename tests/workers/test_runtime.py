"""What a worker process measures between tasks: the fixed part of a switch."""

from __future__ import annotations

from workers.runtime import Runtime, WorkerIdentity


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
