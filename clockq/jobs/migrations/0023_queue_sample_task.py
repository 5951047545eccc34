"""The "clockq: queue sample" periodic task (every 5 s: the dashboard's fine queue depth, waits
and load, clockq/jobs/queue_samples.py) on a database made before it; the other periodic tasks
are left as they are."""

from django.db import migrations


def seed(apps, schema_editor):
    from clockq.jobs.periodic import ensure_periodic_tasks

    ensure_periodic_tasks(
        apps.get_model("django_celery_beat", "PeriodicTask"), apps.get_model("django_celery_beat", "IntervalSchedule")
    )


class Migration(migrations.Migration):
    dependencies = [("jobs", "0022_periodic_task_names")]

    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
