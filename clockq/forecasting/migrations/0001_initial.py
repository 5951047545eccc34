# The models keep their tables (Meta.db_table): moving a model between apps changes Django's
# state only, so an existing database keeps every row and no table is copied.

import django.db.models.deletion
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
                    name="MetricSample",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("at", models.DateTimeField(help_text="When it was taken, to the second.", unique=True)),
                        (
                            "gpu_util",
                            models.FloatField(
                                blank=True, help_text="Mean SM busy over the GPUs that report it.", null=True
                            ),
                        ),
                        (
                            "cpu",
                            models.FloatField(blank=True, help_text="Mean CPU load over the GPU hosts.", null=True),
                        ),
                        (
                            "memory",
                            models.FloatField(blank=True, help_text="Mean memory use over the GPU hosts.", null=True),
                        ),
                        (
                            "queue_depth",
                            models.JSONField(
                                blank=True, default=dict, help_text="Queued jobs by current tier: {tier: n}."
                            ),
                        ),
                        (
                            "held",
                            models.PositiveIntegerField(
                                default=0, help_text="Jobs held for admission (not counted as demand)."
                            ),
                        ),
                        ("running_gpus", models.PositiveIntegerField(default=0, help_text="Busy GPUs: jobs running.")),
                        (
                            "waiting_gpus",
                            models.PositiveIntegerField(default=0, help_text="GPUs that queued jobs ask for."),
                        ),
                        ("gpus", models.PositiveIntegerField(default=0, help_text="Capacity: GPU workers alive.")),
                        (
                            "load_index",
                            models.FloatField(
                                blank=True,
                                help_text="(running + waiting GPUs) / GPUs, at most 2 (clockq/policy/load.py).",
                                null=True,
                            ),
                        ),
                        (
                            "hosts",
                            models.JSONField(
                                blank=True,
                                default=dict,
                                help_text="Per host: {host: {gpus, gpu_util, cpu, memory, busy}}.",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "jobs_metricsample",
                        "ordering": ["-at"],
                    },
                ),
                migrations.CreateModel(
                    name="ModelVersion",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "kind",
                            models.CharField(
                                choices=[("lstm", "LSTM"), ("linear", "linear")], default="lstm", max_length=10
                            ),
                        ),
                        (
                            "path",
                            models.CharField(
                                blank=True, default="", help_text="The saved .keras file (empty: none).", max_length=500
                            ),
                        ),
                        ("train_windows", models.PositiveIntegerField(default=0)),
                        ("validation_windows", models.PositiveIntegerField(default=0)),
                        ("test_windows", models.PositiveIntegerField(default=0)),
                        ("samples", models.PositiveIntegerField(default=0, help_text="Load samples the run read.")),
                        (
                            "validation_mae",
                            models.FloatField(blank=True, help_text="This model's validation MAE.", null=True),
                        ),
                        ("persistence_mae", models.FloatField(blank=True, null=True)),
                        ("linear_mae", models.FloatField(blank=True, null=True)),
                        (
                            "test_metrics",
                            models.JSONField(
                                blank=True, default=dict, help_text="{model: {mae, rmse, bucket_accuracy}}."
                            ),
                        ),
                        (
                            "chosen",
                            models.CharField(
                                default="persistence",
                                help_text="What this run chose: persistence, linear or lstm.",
                                max_length=12,
                            ),
                        ),
                        (
                            "is_champion",
                            models.BooleanField(default=False, help_text="This model serves the forecasts."),
                        ),
                        ("training_seconds", models.FloatField(default=0.0)),
                        ("notes", models.TextField(blank=True, default="")),
                    ],
                    options={
                        "db_table": "jobs_modelversion",
                        "ordering": ["-created_at", "-id"],
                    },
                ),
                migrations.CreateModel(
                    name="Forecast",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("at", models.DateTimeField()),
                        ("horizon_s", models.PositiveIntegerField()),
                        ("value", models.FloatField(help_text="The forecast load index.")),
                        ("model", models.CharField(max_length=12)),
                        ("reason", models.TextField(blank=True, default="")),
                        (
                            "input_at",
                            models.DateTimeField(blank=True, help_text="The newest load sample it read.", null=True),
                        ),
                        ("latency_ms", models.FloatField(blank=True, null=True)),
                        (
                            "version",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to="forecasting.modelversion",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "jobs_forecast",
                        "ordering": ["-at", "-id"],
                        "indexes": [models.Index(fields=["at"], name="jobs_foreca_at_82a232_idx")],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
