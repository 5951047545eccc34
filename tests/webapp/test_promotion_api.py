"""Promotion by hand through the API, and what the job page shows of promotions and lateness."""

from __future__ import annotations

import pytest
from django.utils import timezone

from clockq.jobs.models import Job
from tests.helpers import submit, token_auth

pytestmark = pytest.mark.django_db


def promote(client, user, job_id, body=None):
    return client.post(
        f"/api/jobs/{job_id}/promote", body if body is not None else {}, content_type="application/json",
        **token_auth(user),
    )  # fmt: skip


def test_staff_promote_through_the_api(client, alice, carol):
    job = submit(alice, "SP", "api")
    answer = promote(client, carol, job.pk)
    assert answer.status_code == 200, answer.content
    assert (answer.json()["tier"], answer.json()["original_tier"]) == ("HP", "SP")
    assert Job.objects.get(pk=job.pk).events.last().actor == "carol"

    again = promote(client, carol, job.pk)
    assert again.status_code == 409 and "already promoted" in again.json()["detail"]


def test_a_target_tier_can_be_named_and_is_checked(client, alice, carol):
    job = submit(alice, "BP", "api")
    assert promote(client, carol, job.pk, {"tier": "NOPE"}).json() == {"tier": ["must be one of RT, HP, SP, BP, BK"]}
    assert promote(client, carol, job.pk, {"tier": 3}).status_code == 400
    assert promote(client, carol, job.pk, {"tier": "HP", "extra": 1}).status_code == 400
    assert promote(client, carol, job.pk, {"tier": "BK"}).status_code == 409  # not more urgent
    assert Job.objects.get(pk=job.pk).tier.code == "BP"
    assert promote(client, carol, job.pk, {"tier": "RT"}).json()["tier"] == "RT"


def test_only_staff_may_promote(client, alice, bob):
    job = submit(alice, "SP", "mine")
    assert promote(client, alice, job.pk).status_code == 403  # even the owner
    assert promote(client, bob, job.pk).status_code == 404  # not even visible
    assert client.post(f"/api/jobs/{job.pk}/promote").status_code in (401, 403)
    assert Job.objects.get(pk=job.pk).tier.code == "SP"


def test_the_job_page_shows_promotion_lateness_and_history(client, alice, carol):
    job = submit(alice, "SP", "shown")
    Job.objects.filter(pk=job.pk).update(skipped_rounds=2)
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "Skipped rounds" in page and "2 of 3 before promotion" in page

    promote(client, carol, job.pk)
    Job.objects.filter(pk=job.pk).update(late_at=timezone.now())
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "promoted</strong> from SP" in page
    assert "late</strong>: not started within SP" in page
    assert "promoted SP -&gt; HP by hand" in page
