"""The job serializers build their fields once per class and still answer exactly as DRF would."""

from __future__ import annotations

import pytest
from rest_framework import serializers

from clockq.jobs import services, workloads
from webapp.serializers import JobDetailSerializer, JobSerializer


def plain(serializer_class):
    """The same serializer without the built-once fields: DRF's own way."""
    bases = tuple(base for base in serializer_class.__mro__ if base is not serializer_class)
    assert serializers.ModelSerializer in bases
    return type(
        "Plain" + serializer_class.__name__, (serializer_class,), {"get_fields": serializers.ModelSerializer.get_fields}
    )


@pytest.mark.django_db
@pytest.mark.parametrize("serializer_class", [JobSerializer, JobDetailSerializer])
def test_the_answer_is_drfs_own_and_no_two_instances_share_a_field(alice, serializer_class):
    params = workloads.validate("synthetic", {"steps": 3}, may_run_commands=False)
    job = services.submit_job(owner=alice, name="a", tier_code="SP", workload="synthetic", params=params)
    first, second = serializer_class(job), serializer_class(job)

    assert first.data == plain(serializer_class)(job).data
    assert second.data == first.data
    assert not set(map(id, first.fields.values())) & set(map(id, second.fields.values()))
    assert all(field.parent is first for field in first.fields.values())
