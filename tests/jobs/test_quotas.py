"""Per-user quotas: active jobs and checkpoint storage, refused with a clear message wherever a
job comes in, and enforced again when a running job's checkpoint grows."""

from __future__ import annotations

import json

import pytest

from clockq.bus.dispatch import send_run_slice
from clockq.jobs.models import Job, UserQuota
from clockq.jobs.quotas import QuotaExceeded
from tests.helpers import post_form, submit, token_auth
from workers.runtime import Runtime, WorkerIdentity
from workers.slice_runner import RunOutcome, run_dispatch

pytestmark = pytest.mark.django_db(transaction=True)


def post(client, body, auth):
    return client.generic("POST", "/api/jobs", json.dumps(body), content_type="application/json", **auth)


def job_body(name: str, **params) -> dict:
    return {"name": name, "tier": "BK", "workload": "synthetic", "params": {"steps": 1, **params}}


def test_a_user_at_the_active_job_limit_is_refused_with_a_clear_message(client, alice, bob, settings):
    settings.CLOCKQ_QUOTA_ACTIVE_JOBS = 2
    auth = token_auth(alice)
    assert [post(client, job_body(f"j{i}"), auth).status_code for i in range(2)] == [201, 201]
    refused = post(client, job_body("one-too-many"), auth)
    assert refused.status_code == 400
    assert "already has 2 queued, running or held jobs, the most allowed (2)" in json.dumps(refused.json())
    assert Job.objects.filter(owner=alice).count() == 2
    # Another user is not affected, and an operator can raise alice's limit.
    assert post(client, job_body("bobs"), token_auth(bob)).status_code == 201
    UserQuota.objects.create(user=alice, max_active_jobs=3)
    assert post(client, job_body("now-allowed"), auth).status_code == 201


def test_a_limit_lowered_below_what_a_user_has_says_so(alice, settings):
    # The check counts active jobs only up to one past the limit (it is on every submit's path).
    settings.CLOCKQ_QUOTA_ACTIVE_JOBS = 10
    for i in range(5):
        submit(alice, "BK", f"j{i}", steps=1)
    UserQuota.objects.create(user=alice, max_active_jobs=2)
    with pytest.raises(
        QuotaExceeded, match=r"already has more than 2 queued, running or held jobs, the most allowed \(2\)"
    ):
        submit(alice, "BK", "refused", steps=1)
    UserQuota.objects.filter(user=alice).update(max_active_jobs=5)
    with pytest.raises(QuotaExceeded, match=r"already has 5 queued"):
        submit(alice, "BK", "refused", steps=1)
    assert Job.objects.filter(owner=alice).count() == 5


def test_checkpoint_storage_is_counted_at_submit(client, alice, settings):
    settings.CLOCKQ_QUOTA_CHECKPOINT_MB = 10
    auth = token_auth(alice)
    assert post(client, job_body("fits", state_kb=4000), auth).status_code == 201  # 2 x 4 MB kept
    Job.objects.filter(owner=alice).update(checkpoint_bytes=4_096_000)  # as its checkpoints now hold
    refused = post(client, job_body("too-big", state_kb=2000), auth)
    assert refused.status_code == 400 and "over the limit of 10 MB" in json.dumps(refused.json())


def test_the_web_form_shows_the_quota_message(client, alice, settings):
    settings.CLOCKQ_QUOTA_ACTIVE_JOBS = 1
    submit(alice, "BK", "first", steps=1)
    client.force_login(alice)
    page = post_form(
        client, "/jobs/new", {"name": "second", "tier": "BK", "workload": "synthetic", "params": '{"steps": 1}'}
    )
    assert page.status_code == 400 and "the most allowed (1)" in page.content.decode()


def test_a_checkpoint_that_outgrows_the_quota_fails_the_job_at_once(alice, settings):
    # Given a job admitted under the quota, whose owner's quota is then lowered under its state
    job = submit(alice, "SP", "grows", steps=50, step_ms=5, state_kb=3000)
    other = submit(alice, "SP", "waits", steps=1)  # someone to yield to, so the first checkpoints
    UserQuota.objects.create(user=alice, max_checkpoint_mb=5)
    send_run_slice(other.pk, other.dispatch_token, "sp")

    # When a worker runs it and it must checkpoint
    outcome = run_dispatch(job.pk, job.dispatch_token, Runtime(WorkerIdentity("gpu0@test", 0)))

    # Then it fails once, with the reason, without retries, and keeps nothing over the quota
    job.refresh_from_db()
    assert outcome == RunOutcome.FAILED and job.state == "failed" and job.failures == 0
    assert "over the limit of 5 MB" in job.last_error
    assert job.checkpoint_generation == 0 and job.checkpoint_bytes == 0


def test_the_admin_lists_quotas_with_their_defaults(admin_client, alice, settings):
    UserQuota.objects.create(user=alice, max_active_jobs=7)
    page = admin_client.get("/admin/jobs/userquota/").content.decode()
    assert "alice" in page and "CLOCKQ_QUOTA_ACTIVE_JOBS" in page and str(settings.CLOCKQ_QUOTA_CHECKPOINT_MB) in page


def test_a_running_jobs_work_folder_counts_toward_its_owners_storage(client, alice, settings):
    settings.CLOCKQ_QUOTA_CHECKPOINT_MB = 100
    running = submit(alice, "BK", "writer", steps=1)
    # As the worker measured it while the program ran (workers/storage_watch.py).
    Job.objects.filter(pk=running.pk).update(work_bytes=99 * 10**6, work_files=10)

    refused = post(client, job_body("next", state_kb=1000), token_auth(alice))

    assert refused.status_code == 400, refused.json()
    assert "hold 99 MB of storage" in json.dumps(refused.json())


def test_a_jobs_allowance_is_the_tighter_of_its_own_cap_and_what_its_owners_quota_leaves(alice, settings):
    from clockq.jobs.quotas import allowance_of

    settings.CLOCKQ_QUOTA_CHECKPOINT_MB, settings.CLOCKQ_JOB_STORAGE_MB = 100, 50
    settings.CLOCKQ_QUOTA_FILES, settings.CLOCKQ_JOB_FILES = 1000, 5000
    job, other = submit(alice, "BK", "job", steps=1), submit(alice, "BK", "other", steps=1)

    allowance = allowance_of(job.pk)
    assert allowance.max_bytes == 50 * 10**6 and "CLOCKQ_JOB_STORAGE_MB" in allowance.bytes_limit
    assert allowance.max_files == 1000 and "alice's quota of 1,000 files" in allowance.files_limit

    # Her other job holds 70 MB (two generations of 30 MB and a 10 MB result) and 900 files:
    Job.objects.filter(pk=other.pk).update(checkpoint_bytes=30 * 10**6, result_bytes=10 * 10**6, work_files=900)
    allowance = allowance_of(job.pk)
    assert (allowance.max_bytes, allowance.max_files) == (30 * 10**6, 100)
    assert allowance.over(31 * 10**6, 0).endswith("(30.0 MB; their other jobs hold the rest)")
    assert "over what alice's quota of 1,000 files leaves (100)" in allowance.over(0, 101)
    assert allowance.over(30 * 10**6, 100) == ""
