"""A tier row is found by its code in the one definition (`QueueTier.spec`)."""

from __future__ import annotations

from clockq.jobs.models import QueueTier
from clockq.policy.tiers import TIERS


def test_each_row_is_its_codes_definition(db):
    rows = list(QueueTier.objects.all())
    assert sorted(row.spec.rank for row in rows) == [t.rank for t in TIERS]
    for row in rows:
        assert (row.spec.code, row.spec.rank, row.spec.queue_name) == (row.code, row.rank, row.queue_name)
        assert row.spec.interrupts == (row.code in {"RT", "HP"})
