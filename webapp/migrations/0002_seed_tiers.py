from django.db import migrations


def seed(apps, schema_editor):
    from webapp.tiers import ensure_default_tiers

    ensure_default_tiers(apps.get_model("webapp", "QueueTier"))


class Migration(migrations.Migration):
    dependencies = [("webapp", "0001_initial")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
