"""A tier row is found by its code in the one definition (`QueueTier.spec`)."""

from __future__ import annotations

from clockq.jobs.models import QueueTier
from clockq.policy.tiers import TIERS


def test_each_row_is_its_codes_definition(db):
    rows = list(QueueTier.objects.all())
    assert [row.code for row in rows] == [t.code for t in TIERS]  # in rank order, computed from the code
    for row in rows:
        assert (row.spec.code, row.spec.rank, row.spec.queue_name) == (row.code, row.rank, row.queue_name)
        assert row.spec.interrupts == (row.code in {"RT", "HP"})


def test_a_row_holds_no_copy_of_what_the_definition_says():
    fields = {f.name for f in QueueTier._meta.get_fields()}
    assert not fields & {"rank", "queue_name"}, "rank and queue are the definition's (clockq/policy/tiers.py)"
