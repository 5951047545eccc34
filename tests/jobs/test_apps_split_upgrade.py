"""Upgrading a database made before the KPIs, the control state and the predictor's storage
left clockq.jobs: every row is still there, under its new app, and so are the permissions on it."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from clockq.control_state.models import ControlDecision, ControlState
from clockq.forecasting.models import Forecast, MetricSample, ModelVersion
from clockq.kpis.models import KpiMinute

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("jobs", "0017_quota_indexes"), ("kpis", None), ("control_state", None), ("forecasting", None)]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader.project_state(
        [key for key in executor.loader.applied_migrations if key in executor.loader.graph.nodes]
    ).apps


def test_rows_and_permissions_survive_the_move_to_their_apps():
    old = migrate(BEFORE)
    now = timezone.now()
    tier = old.get_model("jobs", "QueueTier").objects.get(code="SP")
    old.get_model("jobs", "ControlState").objects.create(pk=1, admission_open=False, reason="forecast 0.9")
    old.get_model("jobs", "ControlDecision").objects.create(what="admission_open", reason="r", actor="controller")
    old.get_model("jobs", "MetricSample").objects.create(at=now, load_index=0.5)
    version = old.get_model("jobs", "ModelVersion").objects.create(kind="lstm", is_champion=True)
    old.get_model("jobs", "Forecast").objects.create(at=now, horizon_s=900, value=0.7, model="lstm", version=version)
    old.get_model("jobs", "KpiMinute").objects.create(tier_id=tier.pk, minute=now.replace(second=0), started=3)
    types = old.get_model("contenttypes", "ContentType").objects
    types.filter(app_label="control_state").delete()  # as before the move: no such app yet
    old_type, _ = types.get_or_create(app_label="jobs", model="controlstate")
    old.get_model("auth", "Permission").objects.create(
        content_type=old_type, codename="force_controlstate", name="Can force the control state"
    )

    leaves = MigrationExecutor(connection).loader.graph.leaf_nodes()
    migrate(leaves)

    assert ControlState.objects.get(pk=1).reason == "forecast 0.9"
    assert ControlDecision.objects.get().actor == "controller"
    assert MetricSample.objects.get().load_index == 0.5
    assert Forecast.objects.get().version == ModelVersion.objects.get(is_champion=True)
    assert KpiMinute.objects.get().started == 3
    moved = ContentType.objects.get_for_model(ControlState)
    assert moved.pk == old_type.pk and moved.app_label == "control_state"
    assert Permission.objects.get(codename="force_controlstate").content_type == moved
