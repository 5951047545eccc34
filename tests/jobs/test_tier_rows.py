"""The QueueTier rows agree with the one definition of the tiers, and a system check says when not."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from clockq.jobs.models import QueueTier
from clockq.jobs.services import submit_job
from clockq.jobs.tiers import check_tier_rows
from clockq.policy.tiers import TIERS, UnknownTier

pytestmark = pytest.mark.django_db


def test_the_rows_are_the_defined_tiers_and_the_check_passes():
    rows = list(QueueTier.objects.values_list("code", "use"))
    assert rows == [(t.code, t.use) for t in TIERS]  # in rank order
    assert check_tier_rows(databases=["default"]) == []
    out = io.StringIO()
    call_command("check", "--database", "default", stdout=out)
    assert "no issues" in out.getvalue()


def test_the_check_names_each_row_that_disagrees():
    QueueTier.objects.filter(code="BK").update(code="XX")
    errors = check_tier_rows(databases=["default"])
    assert [e.id for e in errors] == ["clockq.E002", "clockq.E002"]
    assert [e.msg.split(": ", 1)[1] for e in errors] == [
        "a row for tier 'XX', which is not defined (the tiers are RT, HP, SP, BP, BK)",
        "no row for tier BK (experiments)",
    ]
    assert "clockq/policy/tiers.py" in errors[0].msg and "data migration" in errors[0].hint
    assert check_tier_rows() == []  # database checks run only when a database is named


def test_an_operators_settings_are_not_a_disagreement():
    QueueTier.objects.filter(code="SP").update(use="training", base_slice_ms=200, wait_target_ms=None)
    assert check_tier_rows(databases=["default"]) == []


def test_a_job_in_a_tier_that_does_not_exist_is_refused(alice):
    with pytest.raises(UnknownTier, match="no tier 'XX'"):
        submit_job(owner=alice, name="j", tier_code="XX", workload="synthetic", params={})
