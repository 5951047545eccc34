"""KPIs, the control state and the predictor's storage move out of clockq.jobs into apps of
their own (clockq.kpis, clockq.control_state, clockq.forecasting)."""

# The models keep their tables (Meta.db_table): moving a model between apps changes Django's
# state only, so an existing database keeps every row and no table is copied.

from django.db import migrations

MOVED = {
    "kpis": ["kpiminute", "kpihour", "gpuminute", "gpuhour"],
    "control_state": ["controlstate", "controldecision"],
    "forecasting": ["metricsample", "modelversion", "forecast"],
}


def _relabel(apps, schema_editor, forward: bool) -> None:
    """Permissions and admin history point at content types: move them with their models, so
    that what an operator was granted on a model stays granted."""
    content_types = apps.get_model("contenttypes", "ContentType").objects.using(schema_editor.connection.alias)
    for app, models in MOVED.items():
        old, new = ("jobs", app) if forward else (app, "jobs")
        # A content type already made under the new label (by a migrate that ran before) stays.
        taken = content_types.filter(app_label=new, model__in=models).values_list("model", flat=True)
        content_types.filter(app_label=old, model__in=models).exclude(model__in=list(taken)).update(app_label=new)


def relabel_content_types(apps, schema_editor):
    _relabel(apps, schema_editor, forward=True)


def relabel_content_types_back(apps, schema_editor):
    _relabel(apps, schema_editor, forward=False)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0017_quota_indexes"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(
                    name="ControlDecision",
                ),
                migrations.DeleteModel(
                    name="ControlState",
                ),
                migrations.RemoveField(
                    model_name="forecast",
                    name="version",
                ),
                migrations.DeleteModel(
                    name="GpuHour",
                ),
                migrations.DeleteModel(
                    name="GpuMinute",
                ),
                migrations.RemoveField(
                    model_name="kpihour",
                    name="tier",
                ),
                migrations.RemoveField(
                    model_name="kpiminute",
                    name="tier",
                ),
                migrations.DeleteModel(
                    name="MetricSample",
                ),
                migrations.DeleteModel(
                    name="Forecast",
                ),
                migrations.DeleteModel(
                    name="ModelVersion",
                ),
                migrations.DeleteModel(
                    name="KpiHour",
                ),
                migrations.DeleteModel(
                    name="KpiMinute",
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(relabel_content_types, relabel_content_types_back),
    ]
