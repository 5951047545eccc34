"""Beat's one schedule (clockq/jobs/periodic.py): a beat that starts writes the control role's
maintenance with the periods its settings give now, leaves the tasks that the admin owns as the
admin left them, and beat's tables hold no clockq task that the list does not name."""

from __future__ import annotations

import pytest
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from clockq.celery import app
from clockq.jobs.periodic import RECONCILE, ensure_periodic_tasks, periodic_tasks
from control.beat import LockedDatabaseScheduler

# Beat's scheduler drops a connection that is not in autocommit, as a test's transaction is not.
pytestmark = pytest.mark.django_db(transaction=True)


def test_a_starting_beat_writes_the_maintenance_from_its_settings_and_keeps_the_admins_edits(settings):
    # Given the tasks the migrations create, an operator's edit of one, and the reconciler's period set anew
    ensure_periodic_tasks(PeriodicTask, IntervalSchedule)
    slo = PeriodicTask.objects.get(name="clockq: SLO check")
    slo.interval = IntervalSchedule.objects.create(every=99, period=IntervalSchedule.SECONDS)
    slo.save()
    settings.RECONCILE_EVERY_S = 7

    # When a beat starts
    LockedDatabaseScheduler(app=app)

    # Then the reconciler runs every 7 s on the control queue, and the SLO check as the admin left it
    reconcile = PeriodicTask.objects.get(name=RECONCILE)
    assert (reconcile.task, reconcile.interval.every, reconcile.queue) == (
        "clockq.reconcile_queued_jobs",
        7,
        settings.CONTROL_QUEUE,
    )
    assert PeriodicTask.objects.get(name="clockq: SLO check").interval.every == 99
    # And every clockq task that beat may send is one the list names, and each is there
    sent = set(PeriodicTask.objects.filter(task__startswith="clockq.").values_list("name", flat=True))
    assert sent == {p.name for p in periodic_tasks()}
