"""The hosts and workers API: who may drain, what a bad request gets, and what the answers hold
(no worker processes: the rows the launchers write, made here)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from clockq.fleet.models import GpuWorker, Host
from clockq.jobs.models import Job
from tests.helpers import submit, token_auth

# transaction=True: a drain acts once its row is committed (on_commit)
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rack():
    host = Host.objects.create(name="node7", roles=["gpu"], broker="10.0.0.5:6379", seen_at=timezone.now())
    for gpu in (0, 1):
        GpuWorker.objects.create(name=f"gpu{gpu}@node7", host=host, gpu_index=gpu)
    return host


def _as(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def test_anyone_logged_in_reads_the_hosts_but_only_staff_drain(rack, alice, carol):
    listed = Client(**token_auth(alice)).get("/api/hosts").json()["hosts"]
    assert [h["name"] for h in listed] == ["node7"]
    assert listed[0]["live"] is True and [w["name"] for w in listed[0]["workers"]] == ["gpu0@node7", "gpu1@node7"]

    for path in ("/api/hosts/node7/drain", "/api/workers/gpu0@node7/drain", "/api/hosts/node7/resume"):
        assert _as(alice).post(path, content_type="application/json").status_code == 403
    assert Client().get("/api/hosts").status_code == 401
    assert not Host.objects.get(name="node7").drained


def test_draining_a_gpu_records_who_and_why_and_asks_its_job_to_leave(rack, alice, carol):
    job = submit(alice, "SP", "on-gpu0", steps=100)
    Job.objects.filter(pk=job.pk).update(state="running", worker="gpu0@node7")

    answer = Client(**token_auth(carol)).post(
        "/api/workers/gpu0@node7/drain", {"reason": "fan swap"}, content_type="application/json"
    )

    assert answer.status_code == 200
    body = answer.json()
    assert body["drained"] and body["drained_by"] == "carol" and body["drain_reason"] == "fan swap"
    assert body["running_jobs"] == [job.pk] and body["drained_with_host"] is False
    job.refresh_from_db()
    assert job.pending_action == "requeue"
    assert job.events.filter(reason__contains="gpu0@node7 drained by carol").exists()
    # Draining it again keeps the first drain
    again = _as(carol).post("/api/workers/gpu0@node7/drain", {"reason": "other"}, content_type="application/json")
    assert again.json()["drain_reason"] == "fan swap"


def test_a_drained_host_drains_its_gpus_and_a_gpu_of_it_resumes_only_with_it(rack, carol):
    staff = _as(carol)
    body = staff.post("/api/hosts/node7/drain", content_type="application/json").json()
    assert body["drained"] and all(w["drained"] and w["drained_with_host"] for w in body["workers"])

    refused = staff.post("/api/workers/gpu1@node7/resume", content_type="application/json")
    assert refused.status_code == 409 and "resume the host" in refused.json()["detail"]

    staff.post("/api/workers/gpu1@node7/drain", content_type="application/json")  # drained on its own too
    resumed = staff.post("/api/hosts/node7/resume", content_type="application/json").json()
    assert not resumed["drained"]
    assert {w["name"]: w["drained"] for w in resumed["workers"]} == {"gpu0@node7": False, "gpu1@node7": True}
    assert staff.post("/api/workers/gpu1@node7/resume", content_type="application/json").json()["drained"] is False


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/workers/gpu9@node7/drain", 404),
        ("/api/hosts/elsewhere/drain", 404),
        ("/api/workers/gpu0@node7/resume", 200),
        ("/api/workers/not-a-name/drain", 404),
    ],
)
def test_unknown_names_are_404(rack, carol, path, status):
    assert _as(carol).post(path, content_type="application/json").status_code == status


@pytest.mark.parametrize(
    "body", [{"reason": 5}, {"reason": "x" * 301}, {"why": "typo"}, ["reason"]], ids=["number", "long", "field", "list"]
)
def test_a_bad_drain_body_is_400_and_drains_nothing(rack, carol, body):
    answer = _as(carol).post("/api/hosts/node7/drain", body, content_type="application/json")
    assert answer.status_code == 400
    assert not Host.objects.get(name="node7").drained


def test_the_admin_lists_hosts_and_gpus_with_their_drains_and_drains_from_a_list(rack, django_user_model):
    staff = _as(django_user_model.objects.create_superuser("root", "root@example.com", "root-pass-123"))
    staff.post("/api/workers/gpu1@node7/drain", content_type="application/json")
    page = staff.get("/admin/fleet/gpuworker/")
    assert page.status_code == 200 and b"gpu1@node7" in page.content

    staff.post("/admin/fleet/host/", {"action": "drain_hosts", "_selected_action": [rack.pk]})

    assert Host.objects.get(name="node7").drained_by == "root"
    assert staff.get("/admin/fleet/host/").status_code == 200
