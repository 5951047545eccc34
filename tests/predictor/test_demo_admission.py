"""The demo's first backlog on a fresh installation does not hold the newcomer's first job:
admission acts on persistence only after its warm-up (clockq/policy/control.py). The real chain:
`submitdemo`, a load sample, the forecast task, then a job submitted as a user would."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from clockq.bus import heartbeat
from clockq.bus.client import client as broker
from clockq.control_state import control
from clockq.forecasting import load_history
from clockq.jobs.models import Job
from predictor import live
from tests.helpers import token_auth

pytestmark = pytest.mark.django_db


def demo_backlog(django_user_model) -> None:
    """Two GPU workers, the demo's jobs submitted, the GPUs busy with two of its HP jobs, one
    load sample and the forecast that follows it."""
    django_user_model.objects.create_superuser("admin", "admin@example.com", "admin-pass-123")
    for i in range(2):
        heartbeat.announce(broker(), {"hostname": f"gpu{i}@demo", "gpu": i, "host": "demo", "pid": 1, "started": 0.0})
    call_command("submitdemo", rt_waves=0)
    first_two = list(Job.objects.filter(tier__code="HP").order_by("id").values_list("id", flat=True)[:2])
    Job.objects.filter(pk__in=first_two).update(state="running", worker="gpu0@demo")
    sample = load_history.record_sample()
    assert sample.load_index == 2.0  # 11 queued and 2 running over 2 GPUs, clamped: the "200 %"
    assert live.forecast_and_apply()["model"] == "persistence"


def first_job(client, alice) -> dict:
    body = json.dumps({"name": "my-first-job", "tier": "BP", "workload": "synthetic", "params": {"steps": 10}})
    return client.generic("POST", "/api/jobs", body, content_type="application/json", **token_auth(alice)).json()


def test_the_first_job_after_the_demo_is_queued_during_the_warm_up(django_user_model, client, alice):
    demo_backlog(django_user_model)
    state = control.admission()
    assert state.admission_open and "acted on only once 60 load samples are kept (1 so far)" in state.reason
    assert first_job(client, alice)["state"] == "queued"


def test_without_the_warm_up_the_same_backlog_holds_it(settings, django_user_model, client, alice):
    # The rule as it was, persistence acted on from the first sample: what the warm-up avoids.
    settings.CLOCKQ_ADMISSION_WARMUP_SAMPLES = 0
    demo_backlog(django_user_model)
    assert not control.admission().admission_open
    assert first_job(client, alice)["state"] == "held"
