"""GET /api/gpus: the cluster's GPUs, read from Redis."""

from __future__ import annotations

import pytest
from rest_framework.test import APIRequestFactory, force_authenticate

from clockq.bus.client import client
from clockq.bus.gpu_samples import GpuSample, publish


def sample(**overrides) -> GpuSample:
    base = dict(host="h1", gpu_index=0, ts=1700000000.5, simulated=True, gpu_util=0.5, mem_util=0.3, error=None)
    return GpuSample(**{**base, **overrides})


@pytest.mark.django_db
def test_gpus_api_lists_the_cluster(alice):
    from webapp.gpus_api import gpus

    publish(client(), sample(host="a", gpu_index=1, gpu_util=0.25))
    publish(client(), sample(host="a", gpu_index=0, gpu_util=0.75))
    request = APIRequestFactory().get("/api/gpus")
    force_authenticate(request, user=alice)
    response = gpus(request)
    assert response.status_code == 200
    assert response.data["stale_after_s"] == 15
    assert [(g["host"], g["gpu_index"], g["gpu_util"]) for g in response.data["gpus"]] == [
        ("a", 0, 0.75),
        ("a", 1, 0.25),
    ]


@pytest.mark.django_db
def test_gpus_api_needs_authentication():
    from webapp.gpus_api import gpus

    response = gpus(APIRequestFactory().get("/api/gpus"))
    assert response.status_code in (401, 403)
