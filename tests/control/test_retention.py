"""Checkpoints of finished jobs are deleted after the retention period; nothing else is."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from clockq.jobs.checkpoints import CheckpointStore, checkpoint_name
from clockq.jobs.models import Job
from control.retention import delete_old_checkpoints
from tests.helpers import submit

pytestmark = pytest.mark.django_db


def test_old_finished_jobs_lose_their_checkpoints_and_others_keep_them(alice, settings):
    settings.CLOCKQ_CHECKPOINT_RETENTION_S = 3600
    store = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR)
    old, recent, waiting = (submit(alice, name=n) for n in ("old", "recent", "waiting"))
    for job in (old, recent, waiting):
        store.write(job.pk, checkpoint_name(1, "a" * 32), b"state" * 100)
        store.work_dir(job.pk)
    Job.objects.filter(pk__in=[old.pk, waiting.pk]).update(
        checkpoint_generation=1, checkpoint_files=[checkpoint_name(1, "a" * 32)], checkpoint_bytes=500
    )
    two_hours_ago = timezone.now() - timedelta(hours=2)
    Job.objects.filter(pk=old.pk).update(state="succeeded", finished_at=two_hours_ago)
    Job.objects.filter(pk=recent.pk).update(state="failed", finished_at=timezone.now())
    Job.objects.filter(pk=waiting.pk).update(finished_at=two_hours_ago)  # queued again: keeps them

    assert delete_old_checkpoints() == 1
    assert delete_old_checkpoints() == 0  # done once

    assert not store.job_dir(old.pk).exists()
    assert store.job_dir(recent.pk).exists() and store.job_dir(waiting.pk).exists()
    old.refresh_from_db()
    assert old.checkpoints_deleted_at and old.checkpoint_bytes == 0 and old.checkpoint_files == []
    assert "checkpoints deleted 3600 s after the job finished" in old.events.last().reason


def test_healthz_shows_the_checkpoint_disk(client, alice, carol, settings):
    client.force_login(carol)  # the detail is for staff
    settings.CLOCKQ_CHECKPOINT_DIR.mkdir(parents=True, exist_ok=True)
    job = submit(alice)
    Job.objects.filter(pk=job.pk).update(checkpoint_bytes=1000)
    info = client.get("/healthz").json()["checkpoints"]
    assert info["total_bytes"] > 0 and 0 <= info["used_fraction"] <= 1 and info["held_by_jobs_bytes"] == 2000


def test_retention_keeps_a_finished_jobs_result(alice, settings, tmp_path):
    from clockq.jobs.results import ResultStore

    settings.CLOCKQ_CHECKPOINT_RETENTION_S = 0
    store, results = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR), ResultStore(settings.CLOCKQ_CHECKPOINT_DIR)
    job = submit(alice, name="done")
    store.write(job.pk, checkpoint_name(1, "a" * 32), b"state" * 100)
    store.work_dir(job.pk)
    staged = results.staging(job.pk)
    (staged / "model.bin").write_bytes(b"weights")
    manifest = results.store(job.pk, staged)
    Job.objects.filter(pk=job.pk).update(
        state="succeeded", finished_at=timezone.now() - timedelta(seconds=1), result_files=manifest.as_json(),
        result_bytes=manifest.total_bytes,
    )  # fmt: skip
    # A job cancelled just as its worker stored a result: the result was never recorded.
    orphan = submit(alice, name="cancelled")
    staged = results.staging(orphan.pk)
    (staged / "model.bin").write_bytes(b"weights")
    results.store(orphan.pk, staged)
    Job.objects.filter(pk=orphan.pk).update(state="cancelled", finished_at=timezone.now() - timedelta(seconds=1))

    assert delete_old_checkpoints() == 2

    assert sorted(p.name for p in store.job_dir(job.pk).iterdir()) == ["result"]
    assert results.manifest(job.pk).file("model.bin").bytes == 7
    assert not store.job_dir(orphan.pk).exists()


def test_results_are_kept_unless_their_retention_is_set(alice, settings):
    from clockq.jobs.results import ResultStore
    from control.retention import delete_old_results

    results = ResultStore(settings.CLOCKQ_CHECKPOINT_DIR)
    old, recent = submit(alice, name="old"), submit(alice, name="recent")
    for job, age in ((old, timedelta(days=8)), (recent, timedelta(hours=1))):
        staged = results.staging(job.pk)
        (staged / "out.bin").write_bytes(b"out")
        manifest = results.store(job.pk, staged)
        Job.objects.filter(pk=job.pk).update(
            state="succeeded", finished_at=timezone.now() - age, result_files=manifest.as_json(), result_bytes=3
        )

    settings.CLOCKQ_RESULT_RETENTION_S = 0
    assert delete_old_results() == 0  # off by default
    settings.CLOCKQ_RESULT_RETENTION_S = 7 * 86_400
    assert delete_old_results() == 1

    assert results.manifest(old.pk) is None and results.manifest(recent.pk) is not None
    old.refresh_from_db()
    assert (old.result_files, old.result_bytes) == ([], 0)
    assert old.events.last().reason == "result deleted 604800 s after the job finished"
