"""Upgrading a database made before a periodic task changed: beat's own tasks written under their
old names ("reap-expired-leases") are renamed to "clockq: ..." and keep their schedule, none is
left under either name twice (so that beat sends each task once), and a task added since is
created."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django_celery_beat.models import PeriodicTask

from clockq.jobs.periodic import periodic_tasks
from tests.jobs.test_apps_split_upgrade import migrate

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("jobs", "0021_level_from_batch_chance")]


def test_beats_own_tasks_are_renamed_once_and_keep_their_schedule():
    old = migrate(BEFORE)
    tasks, intervals = (
        old.get_model("django_celery_beat", "PeriodicTask"),
        old.get_model("django_celery_beat", "IntervalSchedule"),
    )
    every = intervals.objects.create(every=10, period="seconds")
    tasks.objects.create(name="reap-expired-leases", task="clockq.reap_expired_leases", interval=every)
    tasks.objects.create(name="reconcile-queued-jobs", task="clockq.reconcile_queued_jobs", interval=every)
    # A beat of the new code that started before the migration ran wrote this one anew already.
    tasks.objects.create(name="delete-old-checkpoints", task="clockq.delete_old_checkpoints", interval=every)
    tasks.objects.create(name="clockq: delete old checkpoints", task="clockq.delete_old_checkpoints", interval=every)

    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    names = set(PeriodicTask.objects.filter(task__startswith="clockq.").values_list("name", flat=True))
    assert {p.name for p in periodic_tasks() if p.written_by_beat} <= names
    assert not {"reap-expired-leases", "reconcile-queued-jobs", "delete-old-checkpoints"} & names
    assert PeriodicTask.objects.get(name="clockq: reap expired leases").interval.every == 10
    assert PeriodicTask.objects.filter(task="clockq.delete_old_checkpoints").count() == 1


def test_every_periodic_task_is_named_in_one_style():
    names = [p.name for p in periodic_tasks()]
    assert all(name.startswith("clockq: ") and name == name.replace("-", " ") for name in names), names


def test_the_queue_sample_task_is_created_on_an_older_database():
    old = migrate(BEFORE)
    old.get_model("django_celery_beat", "PeriodicTask").objects.filter(name="clockq: queue sample").delete()

    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    sample = PeriodicTask.objects.get(name="clockq: queue sample")
    assert (sample.task, sample.interval.every, sample.queue) == ("clockq.queue_sample", 5, settings.CONTROL_QUEUE)
