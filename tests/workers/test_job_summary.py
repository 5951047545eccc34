"""A worker's log says what happened to each job in one INFO line when it ends (workers/run/
summary.py); its slices are DEBUG."""

from __future__ import annotations

import logging

import pytest

from tests.helpers import submit
from workers.run.summary import job_summary
from workers.runtime import Runtime, WorkerIdentity
from workers.slice_runner import RunOutcome, run_dispatch

pytestmark = pytest.mark.django_db(transaction=True)


def summaries(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "clockq.jobs.summary" and r.levelno >= logging.INFO]


def test_a_job_that_ends_leaves_one_info_line_with_its_slices_gpu_time_and_result(alice, settings, caplog):
    caplog.set_level(logging.DEBUG, logger="clockq")
    settings.CLOCKQ_MAX_SLICE_MS = 20  # several slices, continued on this free GPU
    job = submit(alice, "SP", "short", steps=20, step_ms=5)
    runtime = Runtime(WorkerIdentity("gpu0@test", 0))

    assert run_dispatch(job.pk, job.dispatch_token, runtime) == RunOutcome.SUCCEEDED

    job.refresh_from_db()
    assert job.slice_count >= 2
    (line,) = summaries(caplog)
    assert line.getMessage() == (
        f"job {job.pk} (short) ended succeeded; {job.slice_count} slice(s), {job.run_ms / 1000:.1f} s of GPU time, "
        "0 preemption(s), 0 switch(es), 0 failure(s)"
    )
    debug = [r for r in caplog.records if r.name == "clockq.jobs.summary" and r.levelno == logging.DEBUG]
    assert [r.getMessage() for r in debug] == [f"job {job.pk}: succeeded"]


def test_a_failed_job_says_why_in_its_line(operator, caplog):
    caplog.set_level(logging.INFO, logger="clockq")
    job = submit(operator, "SP", "broken", workload="command", argv=[""])
    assert run_dispatch(job.pk, job.dispatch_token, Runtime(WorkerIdentity("gpu0@test", 0))) == RunOutcome.FAILED
    (line,) = summaries(caplog)
    assert line.getMessage().startswith(f"job {job.pk} (broken) ended failed: could not start the program ''")


def test_a_job_that_has_not_ended_has_no_summary(alice):
    assert job_summary(submit(alice, "SP", "waiting").pk) is None
