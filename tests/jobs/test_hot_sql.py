"""The switch's hand-written statements read and write exactly what the ORM would (this suite
runs on SQLite and on PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import F
from django.db.models.functions import Greatest
from django.forms.models import model_to_dict
from django.utils import timezone

from clockq.jobs import hot_sql
from clockq.jobs.models import Job, JobEvent, QueueTier, Slice, UserQuota
from tests.helpers import submit

pytestmark = pytest.mark.django_db

FIELDS = ("id", "state", "dispatch_token", "tier_id", "params", "deadline", "checkpoint_files", "progress", "util_ewma")


def _row(job: Job) -> dict:
    row = model_to_dict(Job.objects.get(pk=job.pk))
    for own in ("id", "name", "dispatch_token", "submitted_at", "enqueued_at", "dispatched_at"):
        row.pop(own, None)  # each job's own
    return row


def test_select_one_reads_what_the_orm_reads(alice):
    job = submit(alice, "HP", "a", steps=3)
    Job.objects.filter(pk=job.pk).update(
        deadline=timezone.now() + timedelta(hours=1), checkpoint_files=["gen-1-x.ckpt"], util_ewma=0.5
    )

    got = hot_sql.select_one(Job, job.pk, FIELDS)

    assert got == Job.objects.filter(pk=job.pk).values(*FIELDS).first()
    assert got["deadline"].tzinfo is not None and isinstance(got["params"], dict)
    assert hot_sql.select_one(Job, job.pk + 1000, FIELDS) is None


def test_update_writes_what_the_orm_writes(alice):
    now = timezone.now()
    ours, theirs = submit(alice, "SP", "a"), submit(alice, "SP", "a")
    values = {
        "state": "running",
        "checkpoint_files": ["gen-2-a.ckpt", "gen-1-a.ckpt"],
        "wait_ms": F("wait_ms") + 250,
        "tier_id": F("original_tier_id"),
        "lease_expires_at": now,
        "util_ewma": None,
        "worker": "gpu0@here",
    }

    changed = hot_sql.update(Job, {"id": ours.pk, "state": "queued", "dispatch_token": ours.dispatch_token}, values)
    Job.objects.filter(pk=theirs.pk).update(**values)

    assert changed == 1
    assert _row(ours) == _row(theirs)
    assert Job.objects.get(pk=ours.pk).wait_ms == 250


def test_update_counts_nothing_when_the_compare_and_set_misses(alice):
    job = submit(alice, "SP", "a")

    assert hot_sql.update(Job, {"id": job.pk, "dispatch_token": "0" * 32}, {"state": "running"}) == 0
    assert Job.objects.get(pk=job.pk).state == "queued"


def test_an_expression_it_does_not_know_goes_through_the_orm(alice):
    job = submit(alice, "SP", "a")

    assert hot_sql.update(Job, {"id": job.pk}, {"wait_ms": Greatest(F("wait_ms"), 70)}) == 1
    assert Job.objects.get(pk=job.pk).wait_ms == 70


def test_insert_fills_defaults_and_auto_now(alice):
    job = submit(alice, "SP", "a")
    before = timezone.now()
    event = {"job_id": job.pk, "from_state": "queued", "to_state": "running", "reason": "r", "actor": "w"}
    hot_sql.insert(JobEvent, event)
    hot_sql.insert(
        Slice,
        {"job": job.pk, "worker": "w", "gpu_index": 0, "started_at": before, "ended_at": before}
        | {"planned_ms": 50, "used_ms": 49, "outcome": "yielded", "gpu_util": None},
    )

    written = JobEvent.objects.filter(job=job, reason="r").get()
    assert before <= written.at <= timezone.now()
    piece = Slice.objects.get(job=job)
    defaults = (piece.steps, piece.checkpoint_ms, piece.preempted, piece.gpu_util, piece.plan_reason)
    assert defaults == (0, 0.0, False, None, "")
    with pytest.raises(TypeError, match="no field"):
        hot_sql.insert(JobEvent, {"job_id": job.pk, "color": "red"})


def test_quota_read_reads_what_the_orm_reads(alice, bob):
    from clockq.jobs import quotas

    for i, state in enumerate(["queued", "queued", "running", "held", "succeeded", "failed"]):
        job = submit(alice, "SP", f"j{i}")
        Job.objects.filter(pk=job.pk).update(
            state=state,
            checkpoint_bytes=1000 * i,
            result_bytes=7 * (state == "succeeded"),
            work_bytes=11 * (state == "running"),
        )
    submit(bob, "SP", "bobs")  # another owner's: counted for nobody else
    Job.objects.filter(owner=bob).update(checkpoint_bytes=10**9)
    active = Job.objects.filter(owner=alice, state__in=quotas.ACTIVE).count()

    read = hot_sql.quota_read(alice.pk, quotas.ACTIVE, default_max_active=100)
    assert (read.max_active_jobs, read.max_checkpoint_mb, read.active) == (None, None, active)
    held = quotas._held(read.checkpoint_bytes, read.result_bytes, read.work_bytes)
    assert held == quotas.checkpoint_bytes_of(alice.pk)
    assert (read.checkpoint_bytes, read.result_bytes, read.work_bytes) == (1000 * (1 + 2 + 3 + 4 + 5), 7, 11)
    # The count stops one past the limit: the default's, or the owner's own.
    assert hot_sql.quota_read(alice.pk, quotas.ACTIVE, default_max_active=1).active == 2
    UserQuota.objects.create(user=alice, max_active_jobs=2, max_checkpoint_mb=5)
    read = hot_sql.quota_read(alice.pk, quotas.ACTIVE, default_max_active=100)
    assert (read.max_active_jobs, read.max_checkpoint_mb, read.active) == (2, 5, 3)
    # An owner with no jobs at all.
    assert hot_sql.quota_read(alice.pk + bob.pk + 1, quotas.ACTIVE, 100)[2:] == (0, 0, 0, 0)


def test_a_related_object_is_written_by_its_key(alice):
    job = submit(alice, "SP", "a")
    hp = QueueTier.objects.get(code="HP")

    assert hot_sql.update(Job, {"id": job.pk}, {"tier": hp}) == 1
    assert Job.objects.get(pk=job.pk).tier_id == hp.pk
