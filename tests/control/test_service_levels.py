"""The SLO check against the real database: RT start timeouts, late marks, deadlines."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from clockq.jobs.models import Job
from control.service_levels import check_service_levels
from tests.helpers import submit

pytestmark = pytest.mark.django_db


def submitted_ago(job, **ago):
    Job.objects.filter(pk=job.pk).update(submitted_at=timezone.now() - timedelta(**ago))


def test_an_rt_job_not_started_within_its_timeout_ends_timed_out(alice):
    stale, fresh = submit(alice, "RT", "stale"), submit(alice, "RT", "fresh")
    submitted_ago(stale, milliseconds=1500)
    started = submit(alice, "RT", "started")
    Job.objects.filter(pk=started.pk).update(submitted_at=timezone.now() - timedelta(seconds=5),
                                             first_started_at=timezone.now())  # fmt: skip

    report = check_service_levels()

    assert report.start_timeouts == 1
    assert Job.objects.get(pk=stale.pk).state == "timed_out"
    assert Job.objects.get(pk=stale.pk).events.last().reason == "not started within RT's start timeout of 1000 ms"
    assert Job.objects.get(pk=fresh.pk).state == "queued"
    assert Job.objects.get(pk=started.pk).state == "queued"  # it started once: the timeout is for the first start


def test_other_tiers_are_marked_late_once_and_keep_their_place(alice):
    late_sp, on_time_sp, bk = submit(alice, "SP", "late"), submit(alice, "SP", "fine"), submit(alice, "BK", "bk")
    submitted_ago(late_sp, minutes=11)
    submitted_ago(on_time_sp, minutes=9)
    submitted_ago(bk, days=30)
    token = Job.objects.get(pk=late_sp.pk).dispatch_token

    assert check_service_levels().late == 1
    assert check_service_levels().late == 0  # marked once

    job = Job.objects.get(pk=late_sp.pk)
    assert job.late_at is not None and job.state == "queued" and job.dispatch_token == token
    assert job.events.last().reason == "late: not started within SP's wait target of 10 min; keeps its place"
    assert Job.objects.get(pk=on_time_sp.pk).late_at is None
    assert Job.objects.get(pk=bk.pk).late_at is None  # BK has no target


def test_a_waiting_job_past_its_deadline_ends_timed_out(alice):
    job = submit(alice, "SP", "deadline")
    Job.objects.filter(pk=job.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    assert check_service_levels().deadline_timeouts == 1
    assert Job.objects.get(pk=job.pk).state == "timed_out"
