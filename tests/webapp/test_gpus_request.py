"""A job's `gpus`: asked for through the API (one job or a batch), the form and the admin, shown in
every answer, and refused with a clear 400 that names the most the cluster can run."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from clockq.fleet import capacity
from clockq.fleet.registry import register_gpu_workers
from clockq.jobs.models import Job, Slice
from tests.helpers import post_form, token_auth

pytestmark = pytest.mark.django_db


def body(**extra) -> dict:
    return {"name": "train", "tier": "SP", "workload": "synthetic", "params": {"steps": 10}, **extra}


def post(client, data, auth):
    return client.generic("POST", "/api/jobs", json.dumps(data), content_type="application/json", **auth)


@pytest.fixture
def as_alice(alice):
    return token_auth(alice)


@pytest.fixture
def four_gpus():
    register_gpu_workers("h1", [(f"gpu{i}@h1", i) for i in range(2)])
    register_gpu_workers("h2", [(f"gpu{i}@h2", i) for i in range(2)])


def test_a_job_asks_for_one_gpu_unless_it_says_otherwise_and_the_answer_says_so(client, as_alice, four_gpus):
    made = post(client, body(), as_alice)
    assert made.status_code == 201, made.content
    assert made.json()["gpus"] == 1
    assert post(client, body(gpus=1), as_alice).json()["gpus"] == 1
    job_id = made.json()["id"]
    assert client.get(f"/api/jobs/{job_id}", **as_alice).json()["gpus"] == 1
    assert Job.objects.get(pk=job_id).gpus == 1


def test_more_gpus_than_the_workers_run_together_is_refused_naming_the_most_they_can(client, as_alice, four_gpus):
    refused = post(client, body(gpus=2), as_alice)
    assert refused.status_code == 400
    (error,) = refused.json()["gpus"]
    assert error["message"] == (
        f"2 GPUs asked for; this cluster's GPU workers run jobs of at most {capacity.LARGEST_RUNNABLE} GPU (it has 4)"
    )
    assert not Job.objects.exists()  # nothing half made


def test_more_gpus_than_the_cluster_has_is_refused_naming_its_size(client, as_alice, four_gpus, monkeypatch):
    monkeypatch.setattr(capacity, "LARGEST_RUNNABLE", 64)  # workers that run gangs: the cluster is the bound
    assert post(client, body(gpus=4), as_alice).status_code == 201
    refused = post(client, body(gpus=5), as_alice)
    assert refused.status_code == 400
    assert refused.json()["gpus"][0]["message"] == "5 GPUs asked for; this cluster has 4, the largest job it can run"


@pytest.mark.parametrize("bad", [0, -1, 2.5, "two", True, [2]])
def test_a_gpu_count_that_is_not_a_whole_positive_number_is_refused(client, as_alice, four_gpus, bad):
    refused = post(client, body(gpus=bad), as_alice)
    assert refused.status_code == 400, refused.content
    assert "gpus" in refused.json()
    assert not Job.objects.exists()


def test_a_batch_with_one_entry_too_large_submits_nothing(client, as_alice, four_gpus):
    refused = post(client, [body(), body(gpus=3)], as_alice)
    assert refused.status_code == 400
    assert "gpus" in refused.json()["errors"]["1"]
    assert not Job.objects.exists()


def test_the_form_takes_a_gpu_count_and_refuses_too_many(client, alice, four_gpus):
    client.force_login(alice)
    page = client.get("/jobs/new")
    assert 'name="gpus"' in page.content.decode()
    fields = {"name": "f", "tier": "SP", "workload": "synthetic", "params": '{"steps": 5}'}
    refused = post_form(client, "/jobs/new", {**fields, "gpus": "2"})
    assert refused.status_code == 400 and "run jobs of at most 1 GPU" in refused.content.decode()
    assert not Job.objects.exists()
    made = post_form(client, "/jobs/new", {**fields, "gpus": "1"})
    assert made.status_code == 302
    assert Job.objects.get().gpus == 1


def test_the_admin_add_form_takes_and_checks_the_gpu_count(admin_client, alice, four_gpus):
    data = {"owner": alice.pk, "name": "adm", "tier": "SP", "workload": "synthetic", "params": '{"steps": 5}'}
    refused = admin_client.post("/admin/jobs/job/add/", {**data, "gpus": "3"})
    assert refused.status_code == 200 and "3 GPUs asked for" in refused.content.decode()
    assert not Job.objects.exists()
    assert admin_client.post("/admin/jobs/job/add/", data).status_code == 302  # empty: 1
    job = Job.objects.get()
    assert job.gpus == 1
    assert "GPUs" in admin_client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()


def test_each_slice_in_the_history_names_its_workers_rank_0s_first(client, as_alice, alice, four_gpus):
    job_id = post(client, body(), as_alice).json()["id"]
    now = timezone.now()
    Slice.objects.create(
        job_id=job_id, worker="gpu1@h2", gpu_index=1, started_at=now, ended_at=now, planned_ms=50, used_ms=50,
        outcome="completed",
    )  # fmt: skip
    (piece,) = client.get(f"/api/jobs/{job_id}?history=1", **as_alice).json()["slice_history"]
    assert (piece["worker"], piece["workers"]) == ("gpu1@h2", ["gpu1@h2"])


def test_the_queues_count_the_gpus_the_waiting_jobs_ask_for(client, as_alice, four_gpus):
    for _ in range(3):
        assert post(client, body(tier="HP"), as_alice).status_code == 201
    seen = client.get("/api/queues", **as_alice).json()
    hp = next(t for t in seen["tiers"] if t["tier"] == "HP")
    assert (hp["waiting"], hp["gpus_waiting"], hp["gpus_running"]) == (3, 3, 0)
    assert seen["gpus"] == {"registered": 4, "live": 0, "free": 0}  # no worker is running here
