"""The switch cost the planner stretches slices by counts what a switch costs: a checkpoint, the
restore of one, and the worker's measured hop. Not a first start's setup, which no switch
repeats (a Keras job's framework import and CUDA start took 9.7 s and stretched its slices to
the 5 s maximum), and not a guess from a worker's first, warming-up claims."""

from __future__ import annotations

import time

import pytest
from django.test import override_settings

from tests.helpers import submit, yield_once
from workers.runtime import Runtime, WorkerIdentity
from workers.workloads.synthetic import SyntheticWorkload

pytestmark = pytest.mark.django_db(transaction=True)

SETUP_S = 0.4


@pytest.fixture
def slow_setup(monkeypatch):
    """A workload whose setup takes SETUP_S, as a framework import or a model build does."""
    real = SyntheticWorkload.setup

    def setup(self, ctx):
        time.sleep(SETUP_S)
        real(self, ctx)

    monkeypatch.setattr(SyntheticWorkload, "setup", setup)


@override_settings(CLOCKQ_OVERHEAD_BUDGET=0)
def test_a_first_start_is_not_a_switch_but_a_restore_elsewhere_is(alice, slow_setup):
    job = submit(alice, "SP", "slow-start", steps=400, step_ms=1, state_kb=64)

    job = yield_once(job, Runtime(WorkerIdentity("gpu0@test", 0)))
    first = job.slices.order_by("started_at").first()
    assert first.restore_ms >= SETUP_S * 1000  # the slice row still says what the start took
    # But the switch cost does not count it: only the checkpoint of the slice that yielded (no
    # restore, and the fresh worker's hop is not measured yet).
    left = job.slices.order_by("started_at").last()
    assert left.outcome == "yielded" and job.switch_cost_ms == pytest.approx(left.checkpoint_ms)

    # Another worker sets the workload up again and reads the checkpoint: that is a switch's cost.
    job = yield_once(job, Runtime(WorkerIdentity("gpu1@test", 1)))
    assert job.switch_cost_ms > 0.3 * SETUP_S * 1000  # EWMA, alpha 0.3
