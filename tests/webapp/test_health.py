from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_healthz_is_503_without_gpu_workers(client):
    response = client.get("/healthz")
    body = response.json()
    assert response.status_code == 503
    assert body["checks"]["database"]["ok"] and body["checks"]["broker"]["ok"]
    assert body["checks"]["workers"] == {"ok": False, "gpu_workers": [], "degraded": {}}


@pytest.mark.integration
def test_healthz_is_200_once_gpu_workers_run(start_workers, client):
    start_workers(gpus=2)
    response = client.get("/healthz")
    assert response.status_code == 200
    assert len(response.json()["checks"]["workers"]["gpu_workers"]) == 2


def test_healthz_is_503_when_the_broker_is_down(client, settings):
    from clockq.bus.client import client as broker_client
    from tests.harness import free_port

    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    broker_client.cache_clear()
    try:
        response = client.get("/healthz")
    finally:
        broker_client.cache_clear()
    assert response.status_code == 503 and response.json()["checks"]["broker"] == {"ok": False}


def test_healthz_shows_nvml_errors_that_workers_report(client):
    import time

    from clockq.bus import gpu_samples
    from clockq.bus.client import client as broker_client

    # As a worker whose GPU fell off the bus would publish it.
    sample = gpu_samples.GpuSample(host="node7", gpu_index=3, ts=time.time(), simulated=False, error="GPU is lost")
    gpu_samples.publish(broker_client(), sample)
    body = client.get("/healthz").json()
    assert body["gpu_errors"] == {"gpu3@node7": "GPU is lost"}
