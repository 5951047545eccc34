from django.db import migrations, models

KEPT_GENERATIONS = 2  # what the checkpoint store kept before files were named by the database


def name_existing_checkpoints(apps, schema_editor):
    """Checkpoints written before this were named for their generation alone (gen-00000007.ckpt);
    the store kept the newest two. Name them on their jobs, so they are restored as before."""
    Job = apps.get_model("jobs", "Job")
    for job in Job.objects.filter(checkpoint_generation__gt=0, checkpoints_deleted_at__isnull=True).only(
        "id", "checkpoint_generation"
    ):
        newest = job.checkpoint_generation
        job.checkpoint_files = [
            f"gen-{gen:08d}.ckpt" for gen in range(newest, max(newest - KEPT_GENERATIONS, 0), -1)
        ]
        job.save(update_fields=["checkpoint_files"])


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0015_predictor"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="checkpoint_files",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.RunPython(name_existing_checkpoints, migrations.RunPython.noop),
    ]
