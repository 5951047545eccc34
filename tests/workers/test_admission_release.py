"""Admission end to end on a real GPU worker: jobs submitted while an operator keeps admission
closed wait held, untouched by the worker, and run to success once a forecast finds they would
start; nothing is lost."""

from __future__ import annotations

import json

import pytest

from clockq.bus import queues
from clockq.bus.client import client as broker
from clockq.control_state import control
from clockq.jobs.models import Job
from clockq.policy.tiers import QUEUES_IN_ORDER
from tests.harness import wait_for
from tests.helpers import submit, token_auth, wait_finished

pytestmark = pytest.mark.integration

PARAMS = {"steps": 10, "step_ms": 5, "state_kb": 4}


def test_held_for_admission_jobs_run_to_success_after_reopening(start_workers, client, alice):
    start_workers(gpus=1)
    control.force_state(actor="oscar", admission_open=False, note="closed for the test")

    body = {"name": "api-job", "tier": "SP", "workload": "synthetic", "params": PARAMS}
    response = client.generic(
        "POST", "/api/jobs", json.dumps(body), content_type="application/json", **token_auth(alice)
    )
    assert response.status_code == 201 and response.json()["state"] == "held"
    held = [Job.objects.get(pk=response.json()["id"]), submit(alice, "BK", "bk-job", **PARAMS)]
    rt = submit(alice, "RT", "inference", **PARAMS)

    # The RT job runs while admission is closed; the held jobs are not touched: once the
    # worker has acknowledged the RT job, the broker holds no message it could take for them.
    assert wait_finished(rt)[0].state == "succeeded"
    wait_for(lambda: broker().hlen(queues.UNACKED_KEY) == 0, 30, what="the RT job's message to be acknowledged")
    assert [m for q in QUEUES_IN_ORDER for m in queues.queued_messages(q)] == []
    for job in Job.objects.filter(pk__in=[j.pk for j in held]):
        assert (job.state, job.held_for_admission, job.slice_count) == ("held", True, 0)

    # The operator hands control back. A forecast still above the reopen threshold keeps
    # admission closed, but the GPU is free: the held jobs would start, and are queued.
    control.unforce("oscar")
    control.apply_forecast(0.8, workers=1)
    assert control.admission_open() is False

    done = wait_finished(*held)
    assert [(j.state, j.progress, j.held_for_admission) for j in done] == [("succeeded", 1.0, False)] * 2
    for job in done:
        states = [(e.from_state, e.to_state) for e in job.events.order_by("id")]
        assert states[:2] == [("", "held"), ("held", "queued")]
        assert job.events.order_by("id")[1].reason == "released: it would start now: a GPU is free"
