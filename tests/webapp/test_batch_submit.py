"""Batch submit (`POST /api/jobs` with a list): all or none, each entry checked as a single
submit is, the quota and admission applied to the batch; and token rotation."""

from __future__ import annotations

import json

import pytest

from clockq.bus import dispatch
from clockq.control_state import control
from clockq.jobs.models import Job, JobEvent
from tests.helpers import submit, token_auth

pytestmark = pytest.mark.django_db


def job(name: str, tier: str = "SP", **params) -> dict:
    return {"name": name, "tier": tier, "workload": "synthetic", "params": {"steps": 10, **params}}


def post(client, body, auth):
    raw = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.generic("POST", "/api/jobs", raw, content_type="application/json", **auth)


@pytest.fixture
def as_alice(alice):
    return token_auth(alice)


@pytest.fixture
def sent(monkeypatch):
    """The dispatch messages sent, as (job id, queue)."""
    messages: list[tuple[int, str]] = []
    monkeypatch.setattr(
        dispatch, "send_run_slice", lambda job_id, _token, queue, **_kw: messages.append((job_id, queue))
    )
    return messages


def test_a_batch_of_three_creates_three_jobs_in_order_and_sends_three_messages(
    client, as_alice, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = post(client, [job("a", "HP"), job("b"), job("c", "BK")], as_alice)
    assert response.status_code == 201
    body = response.json()
    assert [(j["name"], j["tier"], j["state"], j["owner"]) for j in body] == [
        ("a", "HP", "queued", "alice"),
        ("b", "SP", "queued", "alice"),
        ("c", "BK", "queued", "alice"),
    ]
    ids = [j["id"] for j in body]
    assert ids == sorted(ids) and Job.objects.count() == 3
    assert [job_id for job_id, _queue in sent] == ids
    assert [e.reason for e in JobEvent.objects.order_by("job_id")] == [
        "submitted to HP",
        "submitted to SP",
        "submitted to BK",
    ]


def test_one_bad_entry_writes_nothing_and_is_named_by_its_index(client, as_alice, sent):
    bad = [job("ok"), job("ok2"), {**job("x"), "tier": "XX"}, {**job("y"), "state": "succeeded"}, job("z", steps=-5)]
    response = post(client, bad, as_alice)
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert set(errors) == {"2", "3", "4"}
    assert "tier" in errors["2"] and "unknown field" in errors["3"]["detail"] and "params" in errors["4"]
    assert Job.objects.count() == 0 and JobEvent.objects.count() == 0 and sent == []


def test_a_wrong_type_in_an_entry_is_named(client, as_alice):
    response = post(client, [job("ok"), {**job("x"), "name": 5}], as_alice)
    assert response.status_code == 400
    assert response.json()["errors"] == {"1": {"name": ["must be a string"]}}
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ([], "empty"),
        ([1, 2], "must be a JSON object"),
        ([job("a"), "b"], "must be a JSON object"),
        ([[job("a")]], "must be a JSON object"),
    ],
)
def test_an_empty_batch_or_one_of_non_objects_is_refused(client, as_alice, body, says):
    response = post(client, body, as_alice)
    assert response.status_code == 400 and says in json.dumps(response.json())
    assert Job.objects.count() == 0


def test_a_batch_over_the_limit_is_refused(client, as_alice, settings):
    settings.CLOCKQ_API_MAX_BATCH = 3
    response = post(client, [job(f"j{i}") for i in range(4)], as_alice)
    assert response.status_code == 400 and "at most 3" in response.json()["detail"]
    assert Job.objects.count() == 0
    assert post(client, [job(f"j{i}") for i in range(3)], as_alice).status_code == 201


def test_a_batch_that_passes_the_quota_only_job_by_job_is_refused_whole(client, alice, as_alice, settings):
    settings.CLOCKQ_QUOTA_ACTIVE_JOBS = 3
    submit(alice)
    response = post(client, [job("a"), job("b"), job("c")], as_alice)  # each alone: 1 < 3
    assert response.status_code == 400 and "the most allowed (3)" in response.json()["detail"]
    assert Job.objects.filter(owner=alice).count() == 1
    assert post(client, [job("a"), job("b")], as_alice).status_code == 201


def test_the_checkpoint_quota_counts_the_batchs_sum(client, as_alice, settings):
    settings.CLOCKQ_QUOTA_CHECKPOINT_MB = 10
    three = [job(n, state_kb=2000) for n in "abc"]  # each alone keeps 2 x 2 MB; together 12 MB
    response = post(client, three, as_alice)
    assert response.status_code == 400 and "limit of 10 MB" in response.json()["detail"]
    assert Job.objects.count() == 0


def test_while_admission_is_closed_non_rt_entries_are_held(client, as_alice, sent, django_capture_on_commit_callbacks):
    control.force_state(actor="op", admission_open=False)
    with django_capture_on_commit_callbacks(execute=True):
        response = post(client, [job("rt", "RT"), job("sp"), job("bk", "BK")], as_alice)
    assert response.status_code == 201
    body = response.json()
    assert [(j["state"], j["held_for_admission"]) for j in body] == [("queued", False), ("held", True), ("held", True)]
    assert [job_id for job_id, _queue in sent] == [body[0]["id"]]  # only the RT job is sent


def test_a_single_object_submit_still_answers_one_job(client, as_alice):
    response = post(client, job("one"), as_alice)
    assert response.status_code == 201 and response.json()["name"] == "one"


def test_session_auth_without_a_token_is_refused_and_a_token_works(client, alice):
    assert post(client, [job("a")], {}).status_code == 401
    assert post(client, [job("a")], token_auth(alice)).status_code == 201


def test_a_rotated_token_stops_working_and_the_new_one_works(client, alice, bob):
    old = token_auth(alice)
    key = old["HTTP_AUTHORIZATION"].split()[1][:15]
    assert post(client, [job("before")], old).status_code == 201
    client.force_login(bob)
    assert client.post(f"/account/tokens/{key}/rotate").status_code == 404  # not bob's
    client.force_login(alice)
    page = client.post(f"/account/tokens/{key}/rotate")
    assert page.status_code == 200
    new = page.content.decode().split('<pre id="new-token">', 1)[1].split("</pre>", 1)[0]
    assert len(new) == 64 and not new.startswith(key)
    assert "Rotate" in client.get("/account/tokens").content.decode()
    client.logout()
    assert post(client, [job("after")], old).status_code in (401, 403)
    assert client.get("/api/jobs", **old).status_code in (401, 403)
    assert post(client, [job("after")], {"HTTP_AUTHORIZATION": f"Token {new}"}).status_code == 201


def _api_calls(job_id: int) -> list[tuple[str, str]]:
    """Every /api/ route (webapp/urls.py), as (method, path) for one of the caller's jobs."""
    return [
        ("GET", "/api/jobs"),
        ("GET", f"/api/jobs/{job_id}?history=1"),
        ("GET", f"/api/jobs/{job_id}/metrics"),
        ("GET", f"/api/jobs/{job_id}/result"),
        ("GET", f"/api/jobs/{job_id}/result/state.bin"),
        ("GET", "/api/queues"),
        ("GET", "/api/gpus"),
        ("GET", "/api/kpis"),
        ("POST", f"/api/jobs/{job_id}/promote"),
        ("POST", f"/api/jobs/{job_id}/cancel"),
    ]


def test_a_token_works_on_every_api_endpoint_and_a_rotated_one_on_none(client, operator, sent):
    """Staff, so that promote is allowed too. A job's result does not exist yet: a 404 (or 409)
    there is the endpoint's own answer, after the token was accepted."""
    job = submit(operator, "SP", "auth-probe")
    auth = token_auth(operator)
    answers = {}
    for method, path in _api_calls(job.pk):
        body = json.dumps({"tier": "HP"}) if path.endswith("/promote") else ""
        answers[path] = client.generic(method, path, body, content_type="application/json", **auth).status_code
    assert not {path: code for path, code in answers.items() if code in (401, 403)}, answers
    assert answers["/api/jobs"] == 200 and answers[f"/api/jobs/{job.pk}/cancel"] == 200

    key = auth["HTTP_AUTHORIZATION"].split()[1][:15]
    client.force_login(operator)
    assert client.post(f"/account/tokens/{key}/rotate").status_code == 200
    client.logout()
    for method, path in _api_calls(job.pk):
        assert client.generic(method, path, "", content_type="application/json", **auth).status_code == 401, path


def test_each_entry_gets_the_errors_a_form_of_its_own_gives(alice):
    # A batch's forms share one copy of the fields (forms.binder): nothing of one entry's
    # validation may show in the next one's.
    from webapp.api import _ApiSubmitForm, _validate
    from webapp.forms import binder

    entries = [
        job("ok"),
        {**job("x"), "tier": "XX"},
        job("ok2", "HP"),
        {**job("y"), "workload": "nope"},
        job("z", steps=-5),
        {**job("d"), "deadline": "2001-01-01T00:00:00Z"},
        {"tier": "SP", "workload": "synthetic"},
        {**job("g"), "gpu_mem_mib": 0},
        {**job("late"), "deadline": "2999-01-01T00:00:00Z", "gpu_mem_mib": 512},
        job("ok3", "BK"),
    ]
    bind = binder(_ApiSubmitForm, user=alice)
    for entry in entries * 2:
        own_errors, own_form = _validate(entry, binder(_ApiSubmitForm, user=alice))
        shared_errors, shared_form = _validate(entry, bind)
        assert shared_errors == own_errors, entry
        if own_form is not None:
            assert shared_form.submission() == own_form.submission()
    assert sum(_validate(e, bind)[0] is None for e in entries) == 4
