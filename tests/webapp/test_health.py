from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(client, carol):
    """The detail of /healthz is for staff: carol."""
    client.force_login(carol)
    return client


@pytest.mark.integration
def test_anyone_gets_the_status_alone_and_staff_or_monitoring_get_the_detail(start_workers, carol, settings):
    from django.test import Client

    settings.CLOCKQ_METRICS_TOKEN = "monitoring-token"
    start_workers(gpus=1)
    staff = Client()
    staff.force_login(carol)

    anonymous = Client().get("/healthz")
    wrong_token = Client().get("/healthz", HTTP_AUTHORIZATION="Bearer wrong")
    monitoring = Client().get("/healthz", HTTP_AUTHORIZATION="Bearer monitoring-token")

    assert (anonymous.status_code, anonymous.json()) == (200, {"status": "ok"})  # no names, no paths
    assert wrong_token.json() == {"status": "ok"}
    for detailed in (monitoring.json(), staff.get("/healthz").json()):
        assert detailed["status"] == "ok" and detailed["checks"]["workers"]["gpu_workers"]
        assert detailed["checkpoints"]["path"] == str(settings.CLOCKQ_CHECKPOINT_DIR)


def test_healthz_is_503_without_gpu_workers(client):
    response = client.get("/healthz")
    body = response.json()
    assert response.status_code == 503
    assert body["checks"]["database"]["ok"] and body["checks"]["broker"]["ok"]
    assert body["checks"]["workers"] == {"ok": False, "gpu_workers": [], "degraded": {}, "drained": {}}


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


def test_healthz_shows_the_forecast_fresh_stale_or_not_yet(client):
    from datetime import timedelta

    from django.utils import timezone

    from clockq.forecasting import forecasts
    from clockq.forecasting.models import MetricSample

    body = client.get("/healthz").json()
    assert body["forecast"]["status"] == "waiting" and body["forecast"]["ok"]  # a fresh stack

    now = timezone.now()
    MetricSample.objects.create(at=now - timedelta(minutes=10), load_index=0.5, gpus=1)
    body = client.get("/healthz").json()
    assert body["forecast"]["status"] == "stale" and not body["forecast"]["ok"]  # samples, no forecast

    forecasts.record_forecast(value=0.5, model="persistence", reason="test", at=now - timedelta(minutes=6))
    forecast = client.get("/healthz").json()["forecast"]
    assert forecast["status"] == "stale" and forecast["age_s"] >= 360

    forecasts.record_forecast(value=0.6, model="lstm", reason="test", at=now - timedelta(seconds=30))
    response = client.get("/healthz")
    forecast = response.json()["forecast"]
    assert forecast["status"] == "ok" and forecast["ok"] and forecast["model"] == "lstm"
    assert 30 <= forecast["age_s"] < 300 and forecast["value"] == 0.6
    # Shown, never a reason for 503 on its own (here: 503 only for want of GPU workers).
    assert response.json()["checks"]["workers"]["ok"] is False
