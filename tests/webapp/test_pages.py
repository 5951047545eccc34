"""The pages behind login: submit form, job list, job detail."""

from __future__ import annotations

import pytest

from clockq.jobs.models import Job
from tests.helpers import post_form, submit

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/jobs/", "/jobs/new", "/jobs/1/"])
def test_pages_need_login(client, path):
    response = client.get(path)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_the_form_submits_a_job_and_shows_it(client, alice):
    client.force_login(alice)
    response = post_form(
        client,
        "/jobs/new",
        {"name": "nightly", "tier": "BP", "workload": "matmul", "params": '{"size": 64, "steps": 10}'},
    )
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert (job.name, job.tier.code, job.params) == ("nightly", "BP", {"size": 64, "steps": 10})
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "nightly" in page and "queued" in page and "submitted to BP" in page


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"name": "x", "tier": "SP", "workload": "matmul", "params": '{"size": 99999}'}, "size: must be between"),
        ({"name": "x", "tier": "SP", "workload": "matmul", "params": "{oops"}, "is not valid JSON"),
        ({"name": "x", "tier": "ZZ", "workload": "matmul", "params": "{}"}, "Select a valid choice"),
        ({"name": "x", "tier": "SP", "workload": "command", "params": '{"argv": ["ls"]}'}, "permission"),
        ({"name": "", "tier": "SP", "workload": "matmul", "params": "{}"}, "This field is required"),
    ],
)
def test_the_form_shows_clear_errors_and_saves_nothing(client, alice, data, error):
    client.force_login(alice)
    response = post_form(client, "/jobs/new", data)
    assert response.status_code == 400
    assert error in response.content.decode()
    assert Job.objects.count() == 0


def test_users_see_only_their_own_jobs(client, alice, bob):
    submit(alice, name="alices-job")
    theirs = submit(bob, name="bobs-job")
    client.force_login(alice)
    listing = client.get("/jobs/").content.decode()
    assert "alices-job" in listing and "bobs-job" not in listing
    assert client.get(f"/jobs/{theirs.pk}/").status_code == 404
    assert client.post(f"/jobs/{theirs.pk}/cancel").status_code == 404


def test_staff_see_everyones_jobs(client, alice, carol):
    submit(alice, name="alices-job")
    client.force_login(carol)
    assert "alices-job" in client.get("/jobs/").content.decode()


def test_cancel_from_the_detail_page(client, alice):
    job = submit(alice)
    client.force_login(alice)
    client.post(f"/jobs/{job.pk}/cancel")
    assert Job.objects.get(pk=job.pk).state == "cancelled"
