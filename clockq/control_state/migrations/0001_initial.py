# The models keep their tables (Meta.db_table): moving a model between apps changes Django's
# state only, so an existing database keeps every row and no table is copied.

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("jobs", "0018_move_kpis_control_state_forecasting_out"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ControlState",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("admission_open", models.BooleanField(default=True)),
                        ("prefetch_on", models.BooleanField(default=False)),
                        (
                            "desired_workers",
                            models.PositiveIntegerField(blank=True, help_text="Empty: no forecast yet.", null=True),
                        ),
                        ("reason", models.TextField(blank=True, default="")),
                        (
                            "forecast",
                            models.FloatField(blank=True, help_text="The latest forecast load index.", null=True),
                        ),
                        ("forecast_at", models.DateTimeField(blank=True, null=True)),
                        ("forced", models.BooleanField(default=False)),
                        ("forced_by", models.CharField(blank=True, default="", max_length=200)),
                        ("updated_at", models.DateTimeField(auto_now=True)),
                    ],
                    options={
                        "verbose_name": "control state",
                        "verbose_name_plural": "control state",
                        "db_table": "jobs_controlstate",
                    },
                ),
                migrations.CreateModel(
                    name="ControlDecision",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("at", models.DateTimeField(auto_now_add=True)),
                        (
                            "what",
                            models.CharField(
                                help_text="admission_open, prefetch_on, desired_workers or forced.", max_length=30
                            ),
                        ),
                        ("old", models.CharField(blank=True, default="", max_length=30)),
                        ("new", models.CharField(blank=True, default="", max_length=30)),
                        ("reason", models.TextField()),
                        ("forecast", models.FloatField(blank=True, null=True)),
                        ("actor", models.CharField(help_text='"controller", or the operator.', max_length=200)),
                    ],
                    options={
                        "db_table": "jobs_controldecision",
                        "ordering": ["-at", "-id"],
                        "indexes": [models.Index(fields=["at"], name="jobs_contro_at_09d2fc_idx")],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
