"""The Django admin: job actions, validated add and edit, editable tiers."""

from __future__ import annotations

import pytest

from clockq.jobs.models import Job, QueueTier
from tests.helpers import submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.com", "root-pass-123"))
    return client


def act(admin_client, action, *jobs):
    return admin_client.post("/admin/jobs/job/", {"action": action, "_selected_action": [j.pk for j in jobs]})


def test_hold_release_cancel_requeue(admin_client, alice):
    job = submit(alice)
    act(admin_client, "hold_jobs", job)
    assert Job.objects.get(pk=job.pk).state == "held"
    act(admin_client, "release_jobs", job)
    assert Job.objects.get(pk=job.pk).state == "queued"
    act(admin_client, "cancel_jobs", job)
    assert Job.objects.get(pk=job.pk).state == "cancelled"
    act(admin_client, "requeue_jobs", job)
    job.refresh_from_db()
    assert job.state == "queued" and job.finished_at is None
    reasons = list(job.events.values_list("reason", flat=True))
    assert reasons == ["submitted to SP", "held", "released", "cancelled", "requeued"]


def test_hold_on_a_running_job_waits_for_the_slice_boundary(admin_client, alice):
    job = submit(alice)
    Job.objects.filter(pk=job.pk).update(state="running")
    act(admin_client, "hold_jobs", job)
    job.refresh_from_db()
    assert job.state == "running" and job.pending_action == "hold"


def test_an_action_that_does_not_apply_is_reported_not_applied(admin_client, alice):
    job = submit(alice)
    response = act(admin_client, "release_jobs", job)
    assert Job.objects.get(pk=job.pk).state == "queued"
    assert response.status_code == 302


def test_the_job_page_shows_slices_and_events(admin_client, alice):
    job = submit(alice, name="visible")
    page = admin_client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    assert "visible" in page and "submitted to SP" in page


def test_filters_and_search(admin_client, alice):
    submit(alice, "RT", name="needle")
    submit(alice, "BK", name="hay")
    page = admin_client.get("/admin/jobs/job/?q=needle").content.decode()
    assert "needle" in page and ">hay<" not in page
    assert admin_client.get("/admin/jobs/job/?state__exact=queued&tier__id__exact=1").status_code == 200
    submit(alice, "BK", name="crunch", workload="matmul", size=8, steps=1)
    by_workload = admin_client.get("/admin/jobs/job/?workload=matmul").content.decode()
    assert "crunch" in by_workload and "needle" not in by_workload


def test_adding_a_job_in_the_admin_validates_and_dispatches(admin_client, alice):
    data = {"owner": alice.pk, "name": "from-admin", "tier": "HP", "workload": "synthetic", "params": '{"steps": 0}'}
    bad = admin_client.post("/admin/jobs/job/add/", data)
    assert bad.status_code == 200 and "steps: must be between" in bad.content.decode()
    assert Job.objects.count() == 0
    good = admin_client.post("/admin/jobs/job/add/", {**data, "params": '{"steps": 5}'})
    assert good.status_code == 302
    job = Job.objects.get()
    assert (job.state, job.tier.code, job.params["steps"]) == ("queued", "HP", 5)
    assert job.owner == alice and job.events.get().actor == "root"


def test_the_admin_add_form_has_the_submit_forms_limits(admin_client, alice):
    """The admin goes through the same form as the web page and the API, size limit included."""
    huge = '{"steps": 5, "padding": "' + "x" * 17_000 + '"}'
    data = {"owner": alice.pk, "name": "big", "tier": "SP", "workload": "synthetic", "params": huge}
    response = admin_client.post("/admin/jobs/job/add/", data)
    assert response.status_code == 200 and "at most 16384 bytes" in response.content.decode()
    assert Job.objects.count() == 0


def test_staff_may_add_a_command_job_in_the_admin(admin_client, alice):
    data = {"owner": alice.pk, "name": "script", "tier": "SP", "workload": "command", "params": '{"argv": ["true"]}'}
    assert admin_client.post("/admin/jobs/job/add/", data).status_code == 302
    assert Job.objects.get().workload == "command"


def test_editing_a_job_keeps_state_and_validates_the_deadline(admin_client, alice):
    job = submit(alice, name="old")
    bad = admin_client.post(
        f"/admin/jobs/job/{job.pk}/change/",
        {
            "name": "new",
            "deadline_0": "2001-01-01",
            "deadline_1": "00:00:00",
            "slices-TOTAL_FORMS": 0,
            "slices-INITIAL_FORMS": 0,
            "events-TOTAL_FORMS": 0,
            "events-INITIAL_FORMS": 0,
        },
    )
    assert "must be in the future" in bad.content.decode()
    assert Job.objects.get(pk=job.pk).name == "old"


def test_tiers_are_editable_and_checked(admin_client):
    sp = QueueTier.objects.get(code="SP")
    url = f"/admin/jobs/queuetier/{sp.pk}/change/"
    bad = admin_client.post(url, {"use": "training", "wait_target_ms": 600000, "base_slice_ms": 10, "min_slice_ms": 20})
    assert "cannot exceed the base slice" in bad.content.decode()
    admin_client.post(url, {"use": "training", "wait_target_ms": 600000, "base_slice_ms": 100, "min_slice_ms": 20})
    assert QueueTier.objects.get(code="SP").base_slice_ms == 100


def test_the_job_page_shows_placement_and_telemetry(admin_client, alice):
    job = submit(alice, name="placed")
    Job.objects.filter(pk=job.pk).update(placement_note="needs 90000 MiB of GPU memory", util_ewma=0.42)
    page = admin_client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    assert "needs 90000 MiB of GPU memory" in page and "0.42" in page
