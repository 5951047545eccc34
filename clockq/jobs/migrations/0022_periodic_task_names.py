"""Beat's own periodic tasks (settings.CELERY_BEAT_SCHEDULE) are named as clockq's others are,
"clockq: ...". Beat writes them under their new names at its next start; the rows under the old
names are renamed here, so that no task is sent twice, once under each name."""

from django.db import migrations

RENAMED = {
    "delete-old-checkpoints": "clockq: delete old checkpoints",
    "reconcile-queued-jobs": "clockq: reconcile queued jobs",
    "reap-expired-leases": "clockq: reap expired leases",
}


def rename(apps, schema_editor, names=RENAMED):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    for old, new in names.items():
        if PeriodicTask.objects.filter(name=new).exists():  # a beat on the new code came first
            PeriodicTask.objects.filter(name=old).delete()
        else:
            PeriodicTask.objects.filter(name=old).update(name=new)


def rename_back(apps, schema_editor):
    rename(apps, schema_editor, {new: old for old, new in RENAMED.items()})


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0021_level_from_batch_chance"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(rename, rename_back)]
