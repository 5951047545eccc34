"""Admission as users and operators see it: the API, the form, the job page and the admin's
control state."""

from __future__ import annotations

import json

import pytest

from clockq.control_state import control
from clockq.control_state.models import ControlDecision, ControlState
from clockq.jobs.models import Job
from tests.helpers import post_form, token_auth

pytestmark = pytest.mark.django_db

BODY = {"name": "train", "tier": "SP", "workload": "synthetic", "params": {"steps": 10}}
HELD_NOTE = (
    "Held: admission closed by oscar. The job is kept, and it is queued when admission reopens; nothing is dropped."
)


def post(client, body, auth):
    return client.generic("POST", "/api/jobs", json.dumps(body), content_type="application/json", **auth)


@pytest.fixture
def closed():
    control.force_state(actor="oscar", admission_open=False)


@pytest.fixture
def admin_client(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.com", "root-pass-123"))
    return client


def test_the_api_says_a_job_is_held_because_admission_is_closed(client, alice, closed):
    auth = token_auth(alice)
    response = post(client, BODY, auth)
    assert response.status_code == 201
    body = response.json()
    assert (body["state"], body["held_for_admission"], body["admission_note"]) == ("held", True, HELD_NOTE)
    assert client.get(f"/api/jobs/{body['id']}", **auth).json()["admission_note"] == HELD_NOTE
    listed = client.get("/api/jobs", **auth).json()["results"]
    assert [(j["id"], j["state"], j["admission_note"]) for j in listed] == [(body["id"], "held", HELD_NOTE)]


def test_an_rt_job_is_still_queued_through_the_api(client, alice, closed):
    body = post(client, {**BODY, "tier": "RT"}, token_auth(alice)).json()
    assert (body["state"], body["held_for_admission"], body["admission_note"]) == ("queued", False, None)


def test_a_closed_forecast_is_named_in_the_answer(client, alice):
    # One GPU, busy, and a new HP job waiting for it: the SP job would wait anyway.
    auth = token_auth(alice)
    running, _ = (post(client, {**BODY, "tier": "HP"}, auth).json() for _ in range(2))
    Job.objects.filter(pk=running["id"]).update(state="running")
    control.apply_forecast(0.91, workers=1)
    body = post(client, BODY, auth).json()
    assert body["admission_note"] == (
        "Held: admission closed (forecast 91% > 85%). The job is kept, and it is queued at the first forecast "
        "at which it would start, or when admission reopens; nothing is dropped."
    )


def test_a_closed_forecast_queues_a_job_while_a_gpu_is_free(client, alice):
    control.apply_forecast(0.91, workers=1)
    body = post(client, BODY, token_auth(alice)).json()
    assert (body["state"], body["held_for_admission"], body["admission_note"]) == ("queued", False, None)
    client.force_login(alice)
    form = client.get("/jobs/new").content.decode()
    assert "Admission closed (forecast 91% &gt; 85%)." in form
    assert "A new job is queued as usual unless the cluster is full for it" in form


def test_with_admission_open_nothing_changes(client, alice):
    body = post(client, BODY, token_auth(alice)).json()
    assert (body["state"], body["held_for_admission"], body["admission_note"]) == ("queued", False, None)


def test_an_operators_hold_has_no_admission_note(client, alice):
    from clockq.jobs import services

    auth = token_auth(alice)
    job = Job.objects.get(pk=post(client, BODY, auth).json()["id"])
    services.hold_job(job, actor="oscar")
    body = client.get(f"/api/jobs/{job.pk}", **auth).json()
    assert (body["state"], body["held_for_admission"], body["admission_note"]) == ("held", False, None)


def test_the_form_and_job_page_say_why_the_job_is_held(client, alice, closed):
    client.force_login(alice)
    form = client.get("/jobs/new").content.decode()
    assert "Admission closed by oscar." in form and "RT jobs are always admitted" in form

    response = post_form(
        client,
        "/jobs/new",
        {"name": "nightly", "tier": "BP", "workload": "matmul", "params": '{"size": 64, "steps": 10}'},
        follow=True,
    )
    page = response.content.decode()
    job = Job.objects.get()
    assert job.state == "held"
    assert f"Job #{job.pk} submitted to BP. {HELD_NOTE}" in page  # the message after the redirect
    assert "Held because" in page and "held: admission closed by oscar" in page  # the page and its history
    assert "(admission closed)" in client.get("/jobs/").content.decode()


def test_the_form_shows_no_banner_while_admission_is_open(client, alice):
    client.force_login(alice)
    assert "admission-closed" not in client.get("/jobs/new").content.decode()


def control_form(state: ControlState, **changes) -> dict:
    data = {
        "admission_open": "on" if state.admission_open else "",
        "prefetch_on": "on" if state.prefetch_on else "",
        "desired_workers": "" if state.desired_workers is None else str(state.desired_workers),
        "forced": "on" if state.forced else "",
        "note": "",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v != ""}


URL = "/admin/control_state/controlstate/1/change/"


def test_the_admin_shows_the_control_state(admin_client):
    control.apply_forecast(0.91, workers=2)
    listing = admin_client.get("/admin/control_state/controlstate/")
    assert listing.status_code == 302 and listing["Location"].endswith(URL)
    page = admin_client.get(URL).content.decode()
    assert "91.0%" in page and "admission closed: forecast 91% &gt; 85%" in page


def test_an_operator_forces_a_state_and_clears_it(admin_client, alice, django_capture_on_commit_callbacks):
    control.apply_forecast(0.91, workers=2)
    from tests.helpers import submit

    held = submit(alice, "SP", "waits")
    state = control.control_state()

    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(
            URL, control_form(state, admission_open="on", desired_workers="5", forced="on", note="drill")
        )
    assert response.status_code == 302
    s = control.control_state()
    assert (s.admission_open, s.desired_workers, s.forced, s.forced_by) == (True, 5, True, "root")
    rows = ControlDecision.objects.filter(actor="root").order_by("id")
    assert [(r.what, r.new) for r in rows] == [("forced", "true"), ("admission_open", "true"), ("desired_workers", "5")]
    assert rows[0].reason == "forced by root: drill"
    assert Job.objects.get(pk=held.pk).state == "queued"  # released by the operator's reopening

    admin_client.post(URL, control_form(control.control_state(), forced=""))
    s = control.control_state()
    assert (s.forced, s.admission_open) == (False, True)
    assert ControlDecision.objects.filter(actor="root").order_by("id").last().what == "forced"

    decisions = admin_client.get("/admin/control_state/controldecision/").content.decode()
    assert "drill" in decisions and "controller" in decisions


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"desired_workers": "-1"}, "greater than or equal to 0"),
        ({"desired_workers": "100000", "forced": "on"}, "At most 64 (CLOCKQ_MAX_GPU_WORKERS)."),
        ({"desired_workers": "abc", "forced": "on"}, "Enter a whole number."),
        ({"admission_open": ""}, "Tick forced to set the state by hand"),
    ],
)
def test_bad_admin_input_is_refused_and_changes_nothing(admin_client, changes, error):
    state = control.control_state()
    before = (state.admission_open, state.prefetch_on, state.desired_workers, state.forced)
    response = admin_client.post(URL, control_form(state, **changes))
    assert response.status_code == 200 and error in response.content.decode()
    s = control.control_state()
    assert (s.admission_open, s.prefetch_on, s.desired_workers, s.forced) == before
    assert not ControlDecision.objects.exists()


def test_control_decisions_are_read_only_in_the_admin(admin_client):
    control.apply_forecast(0.91, workers=2)
    row = ControlDecision.objects.first()
    assert admin_client.get("/admin/control_state/controldecision/add/").status_code == 403
    assert admin_client.get(f"/admin/control_state/controldecision/{row.pk}/change/").status_code == 200  # a view
    admin_client.post(
        f"/admin/control_state/controldecision/{row.pk}/change/", {"what": "x", "reason": "x", "actor": "x"}
    )
    assert ControlDecision.objects.get(pk=row.pk).what == row.what != "x"
