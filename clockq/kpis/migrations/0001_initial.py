# The models keep their tables (Meta.db_table): moving a model between apps changes Django's
# state only, so an existing database keeps every row and no table is copied.

import clockq.kpis.models
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
                    name="GpuHour",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("hour", models.DateTimeField()),
                        ("worker", models.CharField(max_length=200)),
                        ("gpu_index", models.IntegerField()),
                        ("minutes", models.PositiveIntegerField(default=0)),
                        ("busy_ms", models.BigIntegerField(default=0)),
                        ("util_ms", models.FloatField(default=0.0)),
                        ("slices", models.PositiveIntegerField(default=0)),
                    ],
                    options={
                        "db_table": "jobs_gpuhour",
                        "indexes": [models.Index(fields=["hour"], name="jobs_gpuhou_hour_3b1aed_idx")],
                        "constraints": [models.UniqueConstraint(fields=("hour", "worker"), name="gpu_hour_worker")],
                    },
                ),
                migrations.CreateModel(
                    name="GpuMinute",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("minute", models.DateTimeField()),
                        ("worker", models.CharField(max_length=200)),
                        ("gpu_index", models.IntegerField()),
                        ("busy_ms", models.BigIntegerField(default=0)),
                        ("util_ms", models.FloatField(default=0.0)),
                        ("slices", models.PositiveIntegerField(default=0)),
                    ],
                    options={
                        "db_table": "jobs_gpuminute",
                        "indexes": [models.Index(fields=["minute"], name="jobs_gpumin_minute_963052_idx")],
                        "constraints": [models.UniqueConstraint(fields=("minute", "worker"), name="gpu_minute_worker")],
                    },
                ),
                migrations.CreateModel(
                    name="KpiHour",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "queue_depth",
                            models.PositiveIntegerField(
                                default=0,
                                help_text="Jobs queued when the rollup sampled it (an hour: its deepest sample).",
                            ),
                        ),
                        ("started", models.PositiveIntegerField(default=0)),
                        ("wait_ms_sum", models.BigIntegerField(default=0)),
                        (
                            "wait_counts",
                            models.JSONField(
                                default=clockq.kpis.models._empty_wait_counts,
                                help_text="Per WAIT_BUCKETS_MS bucket, then longer.",
                            ),
                        ),
                        ("succeeded", models.PositiveIntegerField(default=0)),
                        ("failed", models.PositiveIntegerField(default=0)),
                        ("timed_out", models.PositiveIntegerField(default=0)),
                        ("cancelled", models.PositiveIntegerField(default=0)),
                        ("on_time", models.PositiveIntegerField(default=0)),
                        ("late", models.PositiveIntegerField(default=0, help_text="Jobs marked late in the period.")),
                        (
                            "promotions",
                            models.PositiveIntegerField(default=0, help_text="Promotions and batch chances."),
                        ),
                        ("slices", models.PositiveIntegerField(default=0)),
                        ("slice_outcomes", models.JSONField(default=dict, help_text="Outcome -> count.")),
                        ("busy_ms", models.BigIntegerField(default=0, help_text="GPU time the slices held.")),
                        (
                            "useful_ms",
                            models.BigIntegerField(
                                default=0, help_text="GPU time whose work was kept (not failed or lost)."
                            ),
                        ),
                        (
                            "util_ms",
                            models.FloatField(default=0.0, help_text="Sum of used_ms x measured GPU utilisation."),
                        ),
                        ("switches", models.PositiveIntegerField(default=0)),
                        (
                            "switch_ms_sum",
                            models.FloatField(default=0.0, help_text="Checkpoint plus restore time of the switches."),
                        ),
                        ("hour", models.DateTimeField(help_text="Start of the hour (UTC).")),
                        (
                            "tier",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, related_name="+", to="jobs.queuetier"
                            ),
                        ),
                    ],
                    options={
                        "db_table": "jobs_kpihour",
                        "indexes": [models.Index(fields=["hour"], name="jobs_kpihou_hour_c90972_idx")],
                        "constraints": [models.UniqueConstraint(fields=("hour", "tier"), name="kpi_hour_tier")],
                    },
                ),
                migrations.CreateModel(
                    name="KpiMinute",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "queue_depth",
                            models.PositiveIntegerField(
                                default=0,
                                help_text="Jobs queued when the rollup sampled it (an hour: its deepest sample).",
                            ),
                        ),
                        ("started", models.PositiveIntegerField(default=0)),
                        ("wait_ms_sum", models.BigIntegerField(default=0)),
                        (
                            "wait_counts",
                            models.JSONField(
                                default=clockq.kpis.models._empty_wait_counts,
                                help_text="Per WAIT_BUCKETS_MS bucket, then longer.",
                            ),
                        ),
                        ("succeeded", models.PositiveIntegerField(default=0)),
                        ("failed", models.PositiveIntegerField(default=0)),
                        ("timed_out", models.PositiveIntegerField(default=0)),
                        ("cancelled", models.PositiveIntegerField(default=0)),
                        ("on_time", models.PositiveIntegerField(default=0)),
                        ("late", models.PositiveIntegerField(default=0, help_text="Jobs marked late in the period.")),
                        (
                            "promotions",
                            models.PositiveIntegerField(default=0, help_text="Promotions and batch chances."),
                        ),
                        ("slices", models.PositiveIntegerField(default=0)),
                        ("slice_outcomes", models.JSONField(default=dict, help_text="Outcome -> count.")),
                        ("busy_ms", models.BigIntegerField(default=0, help_text="GPU time the slices held.")),
                        (
                            "useful_ms",
                            models.BigIntegerField(
                                default=0, help_text="GPU time whose work was kept (not failed or lost)."
                            ),
                        ),
                        (
                            "util_ms",
                            models.FloatField(default=0.0, help_text="Sum of used_ms x measured GPU utilisation."),
                        ),
                        ("switches", models.PositiveIntegerField(default=0)),
                        (
                            "switch_ms_sum",
                            models.FloatField(default=0.0, help_text="Checkpoint plus restore time of the switches."),
                        ),
                        ("minute", models.DateTimeField(help_text="Start of the minute (UTC).")),
                        (
                            "tier",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, related_name="+", to="jobs.queuetier"
                            ),
                        ),
                    ],
                    options={
                        "db_table": "jobs_kpiminute",
                        "indexes": [models.Index(fields=["minute"], name="jobs_kpimin_minute_dd6d8b_idx")],
                        "constraints": [models.UniqueConstraint(fields=("minute", "tier"), name="kpi_minute_tier")],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
