"""The JSON API: submit, read, list, cancel, queues; and every bad input refused cleanly."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission

from clockq.jobs.models import Job, JobEvent
from tests.helpers import submit, token_auth

pytestmark = pytest.mark.django_db

GOOD = {"name": "train", "tier": "SP", "workload": "synthetic", "params": {"steps": 10}}


def post(client, body, auth, path="/api/jobs"):
    raw = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.generic("POST", path, raw, content_type="application/json", **auth)


@pytest.fixture
def as_alice(alice):
    return token_auth(alice)


def test_submit_returns_201_with_the_job(client, as_alice):
    response = post(client, {**GOOD, "deadline": "2099-01-01T00:00:00Z"}, as_alice)
    assert response.status_code == 201
    body = response.json()
    assert body["state"] == "queued" and body["tier"] == "SP" and body["owner"] == "alice"
    assert body["params"]["steps"] == 10 and body["params"]["step_ms"] == 10.0  # defaults filled in
    assert {"id", "progress", "slices", "wait_ms", "run_ms"} <= set(body)
    job = Job.objects.get(pk=body["id"])
    assert job.events.get().reason == "submitted to SP"


def test_get_and_list_show_only_the_callers_jobs(client, alice, bob, as_alice):
    mine = submit(alice, name="mine")
    theirs = submit(bob, name="theirs")
    assert client.get(f"/api/jobs/{mine.pk}", **as_alice).json()["name"] == "mine"
    assert client.get(f"/api/jobs/{theirs.pk}", **as_alice).status_code == 404
    listing = client.get("/api/jobs", **as_alice).json()
    assert [j["name"] for j in listing["results"]] == ["mine"] and listing["count"] == 1


def test_staff_see_every_job(client, alice, carol):
    job = submit(alice)
    assert client.get(f"/api/jobs/{job.pk}", **token_auth(carol)).status_code == 200


def test_a_browser_session_works_too(client, alice):
    client.force_login(alice)
    assert client.get("/api/jobs").status_code == 200


def test_cancel_a_queued_job(client, alice, as_alice):
    job = submit(alice)
    response = client.post(f"/api/jobs/{job.pk}/cancel", **as_alice)
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    again = client.post(f"/api/jobs/{job.pk}/cancel", **as_alice)
    assert again.status_code == 409 and "already cancelled" in again.json()["detail"]


def test_queues_report_waiting_and_running_per_tier(client, alice, as_alice):
    submit(alice, "RT")
    submit(alice, "BK")
    submit(alice, "BK")
    tiers = {t["tier"]: t for t in client.get("/api/queues", **as_alice).json()["tiers"]}
    assert [tiers[c]["waiting"] for c in ("RT", "HP", "SP", "BP", "BK")] == [1, 0, 0, 0, 2]
    assert all(t["running"] == 0 for t in tiers.values())


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({**GOOD, "workload": "rm-rf"}, "workload", "rm-rf"),
        ({**GOOD, "tier": "XX"}, "tier", "XX"),
        ({**GOOD, "params": {"steps": -5}}, "params", "steps: must be between 1 and 10000000"),
        ({**GOOD, "params": {"steps": 10**30}}, "params", "steps: must be between"),
        ({**GOOD, "params": {"steps": 1.5}}, "params", "whole number"),
        ({**GOOD, "params": {"steps": True}}, "params", "whole number"),
        ({**GOOD, "params": {"step_ms": -1.0}}, "params", "step_ms"),
        ({**GOOD, "params": {"state_kb": 10**12}}, "params", "state_kb"),
        ({**GOOD, "params": {"evil": 1}}, "params", "unknown param"),
        ({**GOOD, "params": [1, 2]}, "params", "JSON object"),
        ({**GOOD, "name": "x" * 10_000}, "name", "at most 200 characters"),
        ({**GOOD, "name": ""}, "name", "required"),
        ({**GOOD, "name": 42}, "name", "must be a string"),
        ({**GOOD, "deadline": "yesterday"}, "deadline", "valid date"),
        ({**GOOD, "deadline": "2001-01-01T00:00:00Z"}, "deadline", "future"),
        ({**GOOD, "deadline": "9999-12-31T23:59:00-00:01"}, "deadline", "out of range"),  # year 10000 in UTC
        ({"name": "x", "tier": "SP"}, "workload", "required"),
    ],
)
def test_bad_input_gets_a_clear_400_and_changes_nothing(client, as_alice, body, field, message):
    response = post(client, body, as_alice)
    assert response.status_code == 400, response.content[:300]
    assert message in json.dumps(response.json()[field])
    assert Job.objects.count() == 0 and JobEvent.objects.count() == 0


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", '"just a string"', ""])
def test_a_malformed_body_is_refused(client, as_alice, raw):
    response = post(client, raw, as_alice)
    assert response.status_code == 400
    assert Job.objects.count() == 0


def test_unknown_fields_are_refused(client, as_alice):
    response = post(client, {**GOOD, "state": "succeeded"}, as_alice)
    assert response.status_code == 400 and "state" in response.json()["detail"]
    assert Job.objects.count() == 0


def test_running_a_command_needs_the_permission_not_just_staff(client, as_alice, carol):
    body = {"name": "script", "tier": "SP", "workload": "command", "params": {"argv": ["/bin/true"]}}
    for who in (as_alice, token_auth(carol)):  # a user, and staff without the permission
        refused = post(client, body, who)
        assert refused.status_code == 400 and "'run command' permission" in json.dumps(refused.json())
    assert Job.objects.count() == 0
    carol.user_permissions.add(Permission.objects.get(codename="run_command"))
    carol = type(carol).objects.get(pk=carol.pk)  # permissions are cached on the instance
    assert post(client, body, token_auth(carol)).status_code == 201


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/jobs"),
        ("post", "/api/jobs"),
        ("get", "/api/jobs/1"),
        ("post", "/api/jobs/1/cancel"),
        ("get", "/api/queues"),
    ],
)
def test_unauthenticated_calls_get_401(client, method, path):
    response = getattr(client, method)(path)
    assert response.status_code == 401
    assert Job.objects.count() == 0


def test_a_wrong_or_expired_token_gets_401(client, alice):
    assert post(client, GOOD, {"HTTP_AUTHORIZATION": "Token " + "0" * 64}).status_code == 401
    expired = token_auth(alice, days=-1)
    assert post(client, GOOD, expired).status_code == 401
    assert Job.objects.count() == 0


def test_another_users_job_cannot_be_cancelled(client, bob, as_alice, alice):
    job = submit(bob)
    assert client.post(f"/api/jobs/{job.pk}/cancel", **as_alice).status_code == 404
    assert Job.objects.get(pk=job.pk).state == "queued"


def test_the_list_filters_by_states_tier_and_owner(client, alice, bob, carol):
    # Given alice's SP job queued, her HP job cancelled and bob's BK job queued
    submit(alice, "SP", name="sp")
    cancelled = submit(alice, "HP", name="hp")
    Job.objects.filter(pk=cancelled.pk).update(state="cancelled")
    submit(bob, "BK", name="bk")
    as_carol = token_auth(carol)  # staff see everyone's jobs

    def names(query):
        response = client.get(f"/api/jobs?{query}", **as_carol)
        assert response.status_code == 200, response.content[:300]
        return sorted(j["name"] for j in response.json()["results"])

    # Then each filter, and several together, leave the jobs they name
    assert names("state=queued") == ["bk", "sp"]
    assert names("state=queued,cancelled") == ["bk", "hp", "sp"]
    assert names("tier=HP") == ["hp"]
    assert names("owner=alice") == ["hp", "sp"]
    assert names("owner=alice&state=queued&tier=SP") == ["sp"]
    assert names("owner=nobody") == []
    # And a user who is not staff still sees only their own
    mine = client.get("/api/jobs?owner=bob", **token_auth(alice)).json()
    assert mine["count"] == 0


@pytest.mark.parametrize(
    ("query", "field", "message"),
    [
        ("state=queued,sleeping", "state", "unknown state 'sleeping'"),
        ("tier=XX", "tier", "unknown tier 'XX'"),
        ("owner=a%00b", "owner", "not a username"),
        ("owner=" + "a" * 151, "owner", "not a username"),
    ],
)
def test_a_bad_filter_gets_a_400_naming_it(client, as_alice, query, field, message):
    response = client.get(f"/api/jobs?{query}", **as_alice)
    assert response.status_code == 400
    assert message in response.json()[field][0]
