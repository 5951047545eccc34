"""A slice boundary's read (queue lengths, the job's row, the queued counts) is made during the
slice's last step, on the worker's reader thread, so the GPU does not wait for it after the step;
but a change signalled after that read (an operator's hold, an urgent job) is never missed."""

from __future__ import annotations

import threading

import pytest
from django.test import override_settings

from clockq.bus import counters, signals
from clockq.jobs import services
from clockq.jobs.models import Job, QueueTier
from tests.harness import wait_for
from tests.helpers import submit
from workers.persister import Persister
from workers.run.boundary import SliceBoundary, prefetch_lead_s
from workers.runtime import Runtime, WorkerIdentity
from workers.slice_runner import RunOutcome, run_dispatch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def one_job_per_dispatch(monkeypatch):
    """These tests call run_dispatch for one job and look at what it did: no hand-over to the
    rival it yields to, and no warm job taken after it (tests/workers/test_handover.py has those)."""
    monkeypatch.setattr("workers.slice_runner._hand_over", lambda *_args: None)


@pytest.fixture
def reads(monkeypatch):
    """Which thread made each boundary read, and a hook run on the reader thread after its read."""
    seen: list[str] = []
    after_prefetch: list = []
    real = SliceBoundary._read_boundary

    def read(self, done, cut_short):
        result = real(self, done, cut_short)
        seen.append(threading.current_thread().name)
        if threading.current_thread() is not threading.main_thread():
            for hook in after_prefetch:
                hook(self)
        return result

    real_read_ahead = SliceBoundary.read_ahead

    def read_ahead(self):
        # The step waits here for the read it started: on a loaded machine the read could
        # otherwise still be running at the boundary, which then (rightly) reads afresh.
        real_read_ahead(self)
        self.prefetch.exception(timeout=30)

    monkeypatch.setattr(SliceBoundary, "_read_boundary", read)
    monkeypatch.setattr(SliceBoundary, "read_ahead", read_ahead)
    return seen, after_prefetch


def _runtime(job: Job) -> Runtime:
    runtime = Runtime(WorkerIdentity("gpu0@test", 0))
    assert signals.wait_until_listening(5)
    runtime.threads.interrupts.clear(job.pk)  # flags left by earlier tests (job ids are reused) would cut a slice short
    return runtime


@override_settings(CLOCKQ_OVERHEAD_BUDGET=0)
def test_the_boundary_uses_the_read_made_during_the_last_step(alice, reads):
    seen, _ = reads
    job = submit(alice, "SP", "busy", steps=400, step_ms=20)
    submit(alice, "SP", "rival", steps=1)  # waiting: the boundary yields to it

    assert run_dispatch(job.pk, job.dispatch_token, _runtime(job)) == RunOutcome.YIELDED

    assert seen[-1].startswith("clockq-boundary")  # the boundary it yielded at
    assert Job.objects.get(pk=job.pk).state == "queued"


@override_settings(CLOCKQ_OVERHEAD_BUDGET=0)
def test_a_hold_asked_for_after_that_read_is_still_honoured(alice, operator, reads):
    seen, after_prefetch = reads
    job = submit(alice, "SP", "busy", steps=400, step_ms=20)
    submit(alice, "SP", "rival", steps=1)

    # The operator's hold lands just after the reader thread read the row (pending action none).
    def hold(run):
        services.hold_job(Job.objects.get(pk=run.job_id), actor="op")
        # ...and its signal reaches the worker before the boundary, as it would in a real slice.
        wait_for(
            lambda: run.runtime.threads.interrupts.poked(run.job_id),
            30,
            what="the hold's signal",
        )

    after_prefetch.append(hold)

    assert run_dispatch(job.pk, job.dispatch_token, _runtime(job)) == RunOutcome.HELD

    assert seen[-1] == threading.main_thread().name  # read again, afresh
    assert Job.objects.get(pk=job.pk).state == "held"


@override_settings(CLOCKQ_OVERHEAD_BUDGET=0)
def test_a_foreseen_yield_marks_its_checkpoint_during_the_last_step(alice, reads, monkeypatch):
    marks: list[tuple[str, str]] = []
    real = Persister.mark

    def mark(self, job_id, name):
        marks.append((name, threading.current_thread().name))
        return real(self, job_id, name)

    monkeypatch.setattr(Persister, "mark", mark)
    job = submit(alice, "SP", "busy", steps=400, step_ms=20)
    submit(alice, "SP", "rival", steps=1)

    assert run_dispatch(job.pk, job.dispatch_token, _runtime(job)) == RunOutcome.YIELDED

    named = Job.objects.get(pk=job.pk).checkpoint_files[0]
    assert [thread for name, thread in marks if name == named] == ["clockq-boundary_0"]  # not again after it


@pytest.mark.parametrize(
    ("step_s", "read_s", "budget_s", "lead_s"),
    [
        (0.020, 0.002, 0.2, 0.020),  # the last step covers the read
        (0.001, 0.002, 0.2, 0.004),  # 1 ms steps: twice the read's time, a few steps ahead
        (0.001, 0.100, 0.2, 0.050),  # a read that stalled: never more than a quarter of the slice
        (0.100, 0.100, 0.2, 0.100),  # but always the last step
    ],
)
def test_the_read_starts_early_enough_for_short_steps_and_never_too_early(step_s, read_s, budget_s, lead_s):
    assert prefetch_lead_s(step_s, read_s, budget_s) == pytest.approx(lead_s)


@override_settings(CLOCKQ_OVERHEAD_BUDGET=0)
def test_the_counters_are_written_on_the_reader_thread_after_the_commit(alice, monkeypatch):
    threads: list[str] = []
    real = counters._write_now

    def write_now(write):
        threads.append(threading.current_thread().name)
        real(write)

    monkeypatch.setattr(counters, "_write_now", write_now)
    job = submit(alice, "SP", "busy", steps=400, step_ms=20)
    submit(alice, "SP", "rival", steps=1)
    runtime = _runtime(job)

    assert run_dispatch(job.pk, job.dispatch_token, runtime) == RunOutcome.YIELDED

    runtime.threads.boundary_reader.submit(lambda: None).result(timeout=10)  # what was queued before is done
    assert len(threads) == 2  # the first start, then the yielded slice
    assert all(name.startswith("clockq-boundary") for name in threads), threads
    assert counters.read_counters().slices[("SP", "yielded")] == 1


@override_settings(CLOCKQ_OVERHEAD_BUDGET=0)
def test_a_read_still_in_flight_at_the_boundary_is_waited_for_not_made_again(alice, monkeypatch):
    # The read made during the last step finishes only once the boundary has come for it
    from workers.run import boundary

    monkeypatch.setattr(boundary, "PREFETCH_WAIT_S", 30.0)  # what is tested is the wait, not its bound
    seen: list[str] = []
    at_boundary = threading.Event()
    real_read, real_prefetched = SliceBoundary._read_boundary, SliceBoundary._prefetched

    def read(self, done, cut_short):
        result = real_read(self, done, cut_short)
        seen.append(threading.current_thread().name)
        if threading.current_thread() is not threading.main_thread():
            assert at_boundary.wait(30), "the boundary never came for its read"
        return result

    def prefetched(self):
        at_boundary.set()
        return real_prefetched(self)

    monkeypatch.setattr(SliceBoundary, "_read_boundary", read)
    monkeypatch.setattr(SliceBoundary, "_prefetched", prefetched)
    # A slice of many steps: one 20 ms step that takes longer than a 50 ms slice on a loaded
    # machine ends it before its last-step read begins, and a fresh read is then right.
    QueueTier.objects.filter(code="SP").update(base_slice_ms=400)
    job = submit(alice, "SP", "busy", steps=400, step_ms=20)
    submit(alice, "SP", "rival", steps=1)  # waiting: the boundary yields to it

    assert run_dispatch(job.pk, job.dispatch_token, _runtime(job)) == RunOutcome.YIELDED

    # Then the boundary decided on that read: none made afresh on the GPU's own thread
    assert seen and all(name.startswith("clockq-boundary") for name in seen), seen
    assert Job.objects.get(pk=job.pk).state == "queued"
