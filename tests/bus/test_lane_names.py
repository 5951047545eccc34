"""A GPU's RT lane and its main worker name each other (clockq/bus/lanes.py); a lane is
drained with its GPU and with its host (clockq/fleet/registry.py)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from clockq.bus import lanes
from clockq.fleet import registry
from clockq.fleet.models import GpuWorker, Host


@pytest.mark.parametrize(
    ("main", "lane"), [("gpu0@host-a", "rt0@host-a"), ("gpu12@gpu-7.example", "rt12@gpu-7.example")]
)
def test_a_lane_and_its_main_worker_name_each_other(main, lane):
    assert lanes.lane_name(main) == lane
    assert lanes.main_of(lane) == main


@pytest.mark.parametrize("name", ["gpu0@host", "rtx@host", "rt0@", "rt0", "rt@host", "control@host", "rt-1@host"])
def test_a_name_that_is_no_lane_has_no_main_worker(name):
    assert lanes.main_of(name) is None


@pytest.mark.django_db
def test_a_lane_is_drained_with_its_gpu_and_with_its_host():
    host = Host.objects.create(name="h1", roles=["gpu"])
    GpuWorker.objects.create(name="gpu0@h1", host=host, gpu_index=0, drained_at=timezone.now(), drained_by="carol")
    GpuWorker.objects.create(name="gpu1@h1", host=host, gpu_index=1)

    assert set(registry.drained_names(["gpu0@h1", "rt0@h1", "gpu1@h1", "rt1@h1"])) == {"gpu0@h1", "rt0@h1"}
    assert "gpu0@h1 drained by carol" in registry.drained_names(["rt0@h1"])["rt0@h1"]

    Host.objects.filter(pk=host.pk).update(drained_at=timezone.now(), drained_by="dave")
    assert set(registry.drained_names(["rt1@h1", "rt5@h1"])) == {"rt1@h1", "rt5@h1"}
