"""A paused broker (SIGSTOP: the port still accepts connections, nothing answers) never holds a
web request for the length of the pause, only for the broker timeout (CLOCKQ_BROKER_TIMEOUT_S,
tried twice). The submit commits; the reconciler sends its message once the broker is back."""

from __future__ import annotations

import json
import os
import signal
import threading
from contextlib import contextmanager

import pytest
from django.test import override_settings

from clockq.bus import queues
from clockq.jobs.models import Job
from control.reconcile import reconcile_queued_jobs
from tests.harness import process_stat
from tests.helpers import token_auth

pytestmark = pytest.mark.django_db(transaction=True)  # the wake-up is sent on commit

GOOD = {"name": "while-paused", "tier": "SP", "workload": "synthetic", "params": {"steps": 1}}


PAUSE_S = 60.0  # the broker comes back after this, whatever happens


@contextmanager
def paused(redis_server):
    """The broker stopped until the block ends; yields a function that tells whether it still is."""
    pid = redis_server.proc.pid
    os.kill(pid, signal.SIGSTOP)
    watchdog = threading.Timer(PAUSE_S, os.kill, (pid, signal.SIGCONT))
    watchdog.start()
    try:
        yield lambda: process_stat(pid)[0] == "T"
    finally:
        watchdog.cancel()
        os.kill(pid, signal.SIGCONT)


@override_settings(CLOCKQ_REDISPATCH_GRACE_S=0)
def test_a_submit_during_a_broker_pause_answers_fast_and_the_job_is_sent_later(client, alice, redis_server):
    auth = token_auth(alice)
    with paused(redis_server) as still_paused:
        response = client.generic("POST", "/api/jobs", json.dumps(GOOD), content_type="application/json", **auth)
        answered_in_pause = still_paused()  # it did not wait for the broker to come back
        health = client.get("/healthz")
        assert answered_in_pause and still_paused()
    assert response.status_code == 201
    assert health.status_code == 503 and health.json() == {"status": "unavailable"}
    job = Job.objects.get(pk=response.json()["id"])
    assert job.state == "queued"  # committed, whatever became of its message

    # Once the broker answers again the job has a live message: either a publish that timed out
    # arrived after all (Redis ran the command it had buffered; a duplicate is harmless, the
    # claim's compare-and-set takes one) or the reconciler sends a new one, with a new token
    # that makes any late copy of the old one stale.
    reconcile_queued_jobs()
    job.refresh_from_db()
    live = [token for job_id, token in queues.queued_messages("sp") if job_id == job.pk]
    assert live.count(job.dispatch_token) >= 1
