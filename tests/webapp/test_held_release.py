"""A held job's page says when it is expected to be released
(webapp/templates/webapp/_held_release.html, from clockq.control_state.control.held_release)."""

from __future__ import annotations

import json
import re

import pytest

from clockq.control_state import control
from clockq.jobs.models import Job
from tests.helpers import token_auth

pytestmark = pytest.mark.django_db

BODY = {"name": "train", "tier": "SP", "workload": "synthetic", "params": {"steps": 10}}


def submit(client, alice, **changes) -> dict:
    body = json.dumps({**BODY, **changes})
    return client.generic("POST", "/api/jobs", body, content_type="application/json", **token_auth(alice)).json()


def release_on_page(client, alice, job_id: int) -> str | None:
    client.force_login(alice)
    page = client.get(f"/jobs/{job_id}/").content.decode()
    found = re.search(r'<dd class="held-release">(.*?)</dd>', page, re.S)
    return re.sub(r"<[^>]+>", "", found.group(1)) if found else None


def test_a_job_held_by_the_forecast_shows_the_next_forecast_and_what_it_must_find(client, alice, settings):
    # Given one busy GPU, a new HP job waiting for it, and admission closed by a forecast of 91%
    running, _ = (submit(client, alice, tier="HP") for _ in range(2))
    Job.objects.filter(pk=running["id"]).update(state="running")
    control.apply_forecast(0.91, workers=1)
    # When an SP job is submitted, it is held; its page says when it is asked again, and on what
    held = submit(client, alice)
    assert held["state"] == "held"
    state = control.admission()
    due = state.forecast_at.timestamp() + settings.CLOCKQ_FORECAST_EVERY_S
    text = release_on_page(client, alice, held["id"])
    assert text is not None
    assert text.startswith("asked again at the next forecast, ")
    assert "at the latest when admission reopens: the forecast falls below 75% (the latest forecast is 91%)" in text
    expected = control.held_release(Job.objects.get(pk=held["id"]))
    assert expected is not None and expected.at is not None and expected.at.timestamp() >= due - 1e-6


def test_an_operators_closure_says_who_must_reopen(client, alice):
    control.force_state(actor="oscar", admission_open=False)
    held = submit(client, alice)
    assert release_on_page(client, alice, held["id"]) == "queued when oscar reopens admission"


def test_a_queued_job_has_no_expected_release(client, alice):
    queued = submit(client, alice)
    assert queued["state"] == "queued"
    assert release_on_page(client, alice, queued["id"]) is None
    assert control.held_release(Job.objects.get(pk=queued["id"])) is None
