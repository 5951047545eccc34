from django.db import migrations


def seed(apps, schema_editor):
    from clockq.jobs.tiers import ensure_default_tiers

    ensure_default_tiers(apps.get_model("jobs", "QueueTier"))


class Migration(migrations.Migration):
    dependencies = [("jobs", "0001_initial")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
