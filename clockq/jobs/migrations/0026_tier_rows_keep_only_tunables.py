"""A tier row keeps only what an operator tunes: its rank and queue were copies of the definition
(clockq/policy/tiers.py), and queries now compute the rank from the code (clockq/jobs/tier_rank.py).
The ordering below is that computation as it stood when this was written."""

from django.db import migrations, models

# As the definition had them when the columns went, for a migration back to before it.
RANKS_AND_QUEUES = {"RT": (0, "rt"), "HP": (1, "hp"), "SP": (2, "sp"), "BP": (3, "bp"), "BK": (4, "bk")}


def fill_ranks_and_queues(apps, schema_editor):
    QueueTier = apps.get_model("jobs", "QueueTier")
    for code, (rank, queue) in RANKS_AND_QUEUES.items():
        QueueTier.objects.filter(code=code).update(rank=rank, queue_name=queue)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0025_storage_while_running"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="queuetier",
            options={
                "ordering": [
                    models.Case(
                        models.When(code="RT", then=models.Value(0)),
                        models.When(code="HP", then=models.Value(1)),
                        models.When(code="SP", then=models.Value(2)),
                        models.When(code="BP", then=models.Value(3)),
                        models.When(code="BK", then=models.Value(4)),
                        default=models.Value(5),
                        output_field=models.IntegerField(),
                    )
                ]
            },
        ),
        # Nullable first, so that a migration back re-adds them empty, fills them, then makes
        # them required again (the operations run in reverse).
        migrations.AlterField(
            model_name="queuetier", name="rank", field=models.PositiveSmallIntegerField(null=True, unique=True)
        ),
        migrations.AlterField(
            model_name="queuetier",
            name="queue_name",
            field=models.CharField(editable=False, max_length=20, null=True, unique=True),
        ),
        migrations.RunPython(migrations.RunPython.noop, fill_ranks_and_queues),
        migrations.RemoveField(model_name="queuetier", name="queue_name"),
        migrations.RemoveField(model_name="queuetier", name="rank"),
    ]
