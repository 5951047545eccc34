"""The API as an attacker would try it: from another site, with oversized or hostile bodies,
guessing passwords; and what an internal error looks like."""

from __future__ import annotations

import base64
import json
import logging

import pytest
from knox.models import AuthToken

from clockq.jobs.models import Job, JobEvent
from tests.helpers import token_auth

pytestmark = pytest.mark.django_db

GOOD = {"name": "train", "tier": "SP", "workload": "synthetic", "params": {"steps": 10}}


def basic(user: str, password: str) -> dict:
    return {"HTTP_AUTHORIZATION": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def post_json(client, raw: str | bytes, **auth):
    return client.generic("POST", "/api/jobs", raw, content_type="application/json", **auth)


def nothing_written() -> bool:
    return Job.objects.count() == 0 and JobEvent.objects.count() == 0


# --- no state change from another site -------------------------------------------------------


@pytest.mark.parametrize("basic_auth_on", [False, True])
def test_a_cross_site_form_post_with_basic_credentials_is_refused(client, settings, carol, basic_auth_on):
    """What a hostile page can make a browser send: form-encoded, with credentials the browser
    remembers for the site. It must never create a job, whatever the basic-auth setting."""
    settings.CLOCKQ_API_BASIC_AUTH = basic_auth_on
    form = "name=evil&tier=SP&workload=command&params=%7B%22argv%22%3A%5B%22id%22%5D%7D"
    response = client.generic(
        "POST",
        "/api/jobs",
        form,
        content_type="application/x-www-form-urlencoded",
        HTTP_ORIGIN="https://evil.example",
        **basic("carol", "carol-pass-123"),
    )
    assert response.status_code == (415 if basic_auth_on else 401)
    assert nothing_written()


def test_basic_auth_is_off_by_default(client, alice):
    response = post_json(client, json.dumps(GOOD), **basic("alice", "alice-pass-123"))
    assert response.status_code == 401 and response["WWW-Authenticate"] == "Token"
    assert nothing_written()


def test_basic_auth_when_turned_on_works_and_is_throttled(client, settings, alice):
    settings.CLOCKQ_API_BASIC_AUTH = True
    settings.CLOCKQ_API_BASIC_AUTH_RATE = "3/min"
    codes = [client.get("/api/jobs", **basic("alice", "alice-pass-123")).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]


def test_repeated_wrong_passwords_lock_the_login_out(client, settings, alice):
    settings.CLOCKQ_API_BASIC_AUTH = True
    settings.CLOCKQ_API_BASIC_AUTH_RATE = "1000/min"
    for _ in range(settings.AXES_FAILURE_LIMIT):
        assert client.get("/api/jobs", **basic("alice", "wrong")).status_code == 401
    # The right password no longer gets in, by the API or the login page.
    assert client.get("/api/jobs", **basic("alice", "alice-pass-123")).status_code in (401, 429)
    page = client.post("/accounts/login/", {"username": "alice", "password": "alice-pass-123"})
    assert page.status_code == 429 and "_auth_user_id" not in client.session


def test_the_login_page_locks_out_after_repeated_failures(client, settings, alice):
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post("/accounts/login/", {"username": "alice", "password": "wrong"})
    response = client.post("/accounts/login/", {"username": "alice", "password": "alice-pass-123"})
    assert response.status_code == 429 and "_auth_user_id" not in client.session


# --- bounded bodies and storable text --------------------------------------------------------


def test_an_oversized_body_gets_413_and_is_not_parsed(client, alice):
    body = json.dumps({**GOOD, "name": "x" * 300_000})
    response = post_json(client, body, **token_auth(alice))
    assert response.status_code == 413 and "at most 262144" in response.json()["detail"]
    assert nothing_written()


@pytest.mark.parametrize("depth", [33, 100_000])
def test_deeply_nested_json_gets_400(client, alice, depth):
    params = "[" * depth + "]" * depth
    raw = '{"name": "deep", "tier": "SP", "workload": "synthetic", "params": ' + params + "}"
    response = post_json(client, raw, **token_auth(alice))
    assert response.status_code == 400 and "nested deeper than 32" in response.json()["detail"]
    assert nothing_written()


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"name": "bad \\ud800 name", "tier": "SP", "workload": "synthetic", "params": {}}', "'name'"),
        ('{"name": "n", "tier": "SP", "workload": "synthetic", "params": {"steps": "\\udfff"}}', "'params'"),
        ('{"name": "nul \\u0000", "tier": "SP", "workload": "synthetic", "params": {}}', "'name'"),
        ('{"name": "n", "tier": "\\ud83d", "workload": "synthetic", "params": {}}', "'tier'"),
        ('{"name": "n", "\\ud800": 1}', "a field name"),
    ],
)
def test_text_that_cannot_be_stored_gets_a_400_naming_the_field(client, alice, raw, field):
    response = post_json(client, raw, **token_auth(alice))
    assert response.status_code == 400
    assert field in response.json()["detail"]
    assert nothing_written()


# --- internal errors ------------------------------------------------------------------------


def test_a_500_is_json_and_leaves_its_traceback_in_the_log(client, alice, monkeypatch, log_records):
    from clockq.jobs import services

    def broken(**kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(services, "submit_job", broken)
    logger = logging.getLogger("clockq.api")
    logger.addHandler(log_records)
    try:
        response = post_json(client, json.dumps(GOOD), **token_auth(alice))
    finally:
        logger.removeHandler(log_records)
    assert response.status_code == 500 and response.json() == {"detail": "Internal error; it has been logged."}
    (record,) = [r for r in log_records.records if r.levelno == logging.ERROR]
    assert "POST /api/jobs" in record.getMessage() and record.exc_info[1].args == ("disk on fire",)


# --- tokens ---------------------------------------------------------------------------------


def test_a_token_made_on_the_tokens_page_is_shown_once_and_stored_hashed(client, alice):
    client.force_login(alice)
    page = client.post("/account/tokens/new").content.decode()
    token = page.split('<pre id="new-token">', 1)[1].split("</pre>", 1)[0]
    assert len(token) == 64
    stored = AuthToken.objects.get(user=alice)
    assert stored.digest != token and token not in stored.digest and stored.token_key == token[:15]
    assert "new-token" not in client.get("/account/tokens").content.decode()  # never shown again
    client.logout()
    assert client.get("/api/jobs", HTTP_AUTHORIZATION=f"Token {token}").status_code == 200


def test_a_revoked_token_no_longer_works(client, alice, bob):
    auth = token_auth(alice)
    key = auth["HTTP_AUTHORIZATION"].split()[1][:15]
    client.force_login(bob)
    assert client.post(f"/account/tokens/{key}/revoke").status_code == 404  # not bob's to revoke
    client.force_login(alice)
    assert client.post(f"/account/tokens/{key}/revoke").status_code == 302
    client.logout()
    assert client.get("/api/jobs", **auth).status_code == 401


def test_createtoken_prints_a_working_token(client, alice):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("createtoken", "alice", "--days", "1", stdout=out)
    token = out.getvalue().strip()
    assert client.get("/api/jobs", HTTP_AUTHORIZATION=f"Token {token}").status_code == 200


def test_an_expired_token_is_refused_and_swept(client, alice):
    from datetime import timedelta

    from django.utils import timezone

    live, expired = token_auth(alice), token_auth(alice)
    other_expired = token_auth(alice)
    past = timezone.now() - timedelta(seconds=1)
    for auth in (expired, other_expired):
        AuthToken.objects.filter(token_key=auth["HTTP_AUTHORIZATION"].split()[1][:15]).update(expiry=past)

    assert client.get("/api/jobs", **expired).status_code == 401
    assert AuthToken.objects.filter(user=alice).count() == 2  # the presented one is deleted at once
    assert client.get("/api/jobs", **live).status_code == 200  # and a call does not sweep the others
    assert AuthToken.objects.filter(user=alice).count() == 2
    client.force_login(alice)
    assert client.get("/account/tokens").status_code == 200  # the tokens page does
    assert AuthToken.objects.filter(user=alice).count() == 1
    client.logout()
    assert client.get("/api/jobs", **other_expired).status_code == 401
    assert client.get("/api/jobs", **live).status_code == 200
