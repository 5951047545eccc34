"""`make demo`'s workload (manage.py submitdemo): shaped to show promotions on the dashboard."""

from __future__ import annotations

import io
from collections import Counter

import pytest
from django.core.management import call_command

from clockq.jobs.models import Job

pytestmark = pytest.mark.django_db


def test_the_demo_outnumbers_the_gpus_with_hp_work_and_starves_sp_jobs_behind_it(django_user_model):
    django_user_model.objects.create_user("admin", password="admin-pass-123", is_staff=True)

    call_command("submitdemo", rt_waves=2, rt_first=0, rt_every=0, stdout=io.StringIO())

    per_tier = Counter(Job.objects.values_list("tier__code", flat=True))
    # No GPU worker alive here: two GPUs assumed, so three HP jobs keep both busy and one waiting.
    assert per_tier == {"HP": 3, "SP": 4, "RT": 4, "BP": 2, "BK": 4}
    first = list(Job.objects.order_by("id").values_list("tier__code", flat=True)[:3])
    assert first == ["HP", "HP", "HP"]  # the GPUs are busy with HP before the SP jobs queue
    assert set(Job.objects.values_list("owner__username", flat=True)) == {"admin"}
