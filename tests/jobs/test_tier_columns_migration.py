"""The migration that took rank and queue off the tier rows keeps every row and its tunables,
and a migration back fills the columns again from the definition."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from clockq.jobs.models import QueueTier
from clockq.policy.tiers import TIERS
from tests.jobs.test_apps_split_upgrade import migrate

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("jobs", "0025_storage_while_running")]
AFTER = [("jobs", "0026_tier_rows_keep_only_tunables")]


@pytest.fixture(autouse=True)
def _back_to_the_newest():
    """Whatever happens, the database ends migrated to the newest: the tests after this one on
    the same process share it."""
    yield
    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


def test_back_and_forth_the_rows_keep_their_settings_and_the_old_columns_are_refilled():
    old = migrate(BEFORE)
    rows = old.get_model("jobs", "QueueTier").objects
    assert sorted(rows.values_list("rank", "code", "queue_name")) == [(t.rank, t.code, t.queue_name) for t in TIERS]
    rows.filter(code="SP").update(base_slice_ms=321)

    migrate(AFTER)
    assert [t.code for t in QueueTier.objects.all()] == [t.code for t in TIERS]
    assert QueueTier.objects.get(code="SP").base_slice_ms == 321

    old = migrate(BEFORE)  # and back: the columns return, filled from the definition
    rows = old.get_model("jobs", "QueueTier").objects
    assert sorted(rows.values_list("rank", "code", "queue_name")) == [(t.rank, t.code, t.queue_name) for t in TIERS]
