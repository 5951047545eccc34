"""Messages are only wake-ups: duplicates, stale tokens and a wiped broker never run a job twice
or lose it."""

from __future__ import annotations

import pytest
from django.test import override_settings

from clockq.bus import queues
from clockq.bus.client import client
from clockq.bus.dispatch import send_run_slice
from clockq.jobs.models import Job, new_token
from control.reconcile import reconcile_queued_jobs
from tests.harness import wait_for
from tests.helpers import assert_no_overlap, claims, submit, wait_finished

pytestmark = pytest.mark.integration


def test_duplicate_and_stale_messages_never_run_a_job_twice(start_workers, alice):
    # Given a queued job whose message is duplicated, plus a stale token and a malformed message
    job = submit(alice, "SP", "dup", steps=20, step_ms=10)
    send_run_slice(job.pk, job.dispatch_token, "sp")
    send_run_slice(job.pk, job.dispatch_token, "sp")
    send_run_slice(job.pk, new_token(), "sp")
    send_run_slice(job.pk, "not-a-token", "sp")
    assert queues.waiting_by_rank()[2] == 5

    # When a worker consumes all of them
    start_workers(gpus=1)
    (job,) = wait_finished(job)
    wait_for(lambda: queues.waiting_by_rank()[2] == 0, 10, what="the queue to drain")

    # Then the job ran exactly once, in one claim, with no overlapping slices
    assert job.state == "succeeded"
    assert claims(job) == 1
    assert_no_overlap(job)
    slices_after_success = job.slices.count()

    # And a duplicate arriving after success does nothing: the one worker takes messages in
    # order, so once a job queued behind the duplicate has finished, the duplicate was handled.
    send_run_slice(job.pk, job.dispatch_token, "sp")
    (behind,) = wait_finished(submit(alice, "SP", "behind", steps=1, step_ms=1))
    assert behind.state == "succeeded"
    job.refresh_from_db()
    assert job.state == "succeeded" and job.slices.count() == slices_after_success and claims(job) == 1


def test_two_workers_racing_for_duplicates_never_overlap(start_workers, alice):
    jobs = [submit(alice, "SP", f"j{i}", steps=15, step_ms=10) for i in range(4)]
    for job in jobs:
        for _ in range(3):
            send_run_slice(job.pk, job.dispatch_token, "sp")
    start_workers(gpus=2)
    for job in wait_finished(*jobs):
        assert job.state == "succeeded"
        assert_no_overlap(job)


@override_settings(CLOCKQ_REDISPATCH_GRACE_S=0)
def test_a_broker_restarted_empty_loses_no_queued_job(start_workers, redis_server, alice):
    # Given three queued jobs whose messages sit in the broker
    jobs = [submit(alice, tier, f"j-{tier}", steps=10, step_ms=5) for tier in ("HP", "SP", "BK")]
    assert sum(queues.waiting_by_rank()) == 3
    assert reconcile_queued_jobs() == 0  # every message is there: nothing to do

    # When the broker restarts with nothing in it
    redis_server.restart_empty()
    wait_for(_broker_answers, 10, what="the broker to come back")
    assert sum(queues.waiting_by_rank()) == 0

    # Then the reconciler dispatches each job again, once
    assert reconcile_queued_jobs() == 3
    assert reconcile_queued_jobs() == 0
    start_workers(gpus=1)
    for job in wait_finished(*jobs):
        assert job.state == "succeeded"
        # Run once: claimed once, and again only after each time it made way
        assert claims(job) == 1 + job.slices.filter(outcome="yielded").count()
        assert job.events.filter(actor="reconciler").count() == 1


@pytest.mark.django_db(transaction=True)  # the message is sent on commit
@override_settings(CLOCKQ_REDISPATCH_GRACE_S=0)
def test_the_reconciler_leaves_a_job_whose_message_is_waiting(alice):
    job = submit(alice, "BK", "patient", steps=1)
    assert reconcile_queued_jobs() == 0
    assert Job.objects.get(pk=job.pk).dispatch_token == job.dispatch_token


def _broker_answers() -> bool:
    try:
        return client().ping()
    except Exception:
        return False


@pytest.mark.django_db(transaction=True)
def test_waiting_jobs_past_their_deadline_time_out(alice):
    from datetime import timedelta

    from django.utils import timezone

    from clockq.jobs.services import hold_job
    from control.service_levels import time_out_overdue_jobs

    queued = submit(alice, "BK", "late-queued", steps=1)
    held = hold_job(submit(alice, "BK", "late-held", steps=1), actor="alice")
    on_time = submit(alice, "BK", "on-time", steps=1)
    past = timezone.now() - timedelta(seconds=1)
    Job.objects.filter(pk__in=[queued.pk, held.pk]).update(deadline=past)
    Job.objects.filter(pk=on_time.pk).update(deadline=timezone.now() + timedelta(hours=1))

    assert time_out_overdue_jobs() == 2

    states = dict(Job.objects.values_list("name", "state"))
    assert states == {"late-queued": "timed_out", "late-held": "timed_out", "on-time": "queued"}
    assert Job.objects.get(pk=held.pk).events.last().reason == "deadline passed while held"
