"""A cancel that races with a worker's slice boundary still cancels the job."""

from __future__ import annotations

import pytest

from clockq.jobs import services
from clockq.jobs.models import Job, new_token
from tests.helpers import submit

pytestmark = pytest.mark.django_db


def test_a_cancel_that_loses_the_compare_and_set_to_a_requeue_tries_again(alice, monkeypatch):
    job = submit(alice, "SP", "busy")
    Job.objects.filter(pk=job.pk).update(state="running")
    real = services.transition
    calls = []

    def worker_moves_first(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # the worker requeues the job (new token) just before our write
            Job.objects.filter(pk=job.pk).update(state="queued", dispatch_token=new_token())
            return None  # what the lost compare-and-set returns
        return real(*args, **kwargs)

    monkeypatch.setattr(services, "transition", worker_moves_first)
    cancelled = services.cancel_job(Job.objects.get(pk=job.pk), actor="alice")

    assert cancelled.state == "cancelled" and len(calls) == 2


def test_a_job_that_ended_meanwhile_is_not_cancelled(alice, monkeypatch):
    job = submit(alice, "SP", "finishing")

    def worker_finishes_first(*args, **kwargs):
        Job.objects.filter(pk=job.pk).update(state="succeeded")
        return None

    monkeypatch.setattr(services, "transition", worker_finishes_first)
    with pytest.raises(services.ActionRefused, match="while it is succeeded"):
        services.cancel_job(Job.objects.get(pk=job.pk), actor="alice")
