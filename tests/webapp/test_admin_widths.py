"""The admin's tables fit a 1,400 px screen: on every change list, with rows in it, no column
is cut off behind a horizontal scroll (Django's admin scrolls a wide table inside its box)."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.urls import reverse
from django.utils import timezone

from clockq.control_state import control
from clockq.fleet.models import GpuWorker, Host
from clockq.forecasting.models import Forecast, MetricSample, ModelVersion
from clockq.jobs.models import Job
from tests.browser import TIMEOUT_MS, log_in
from tests.helpers import submit

pytestmark = pytest.mark.django_db(transaction=True)  # the live server needs committed rows

SCREEN = {"width": 1400, "height": 900}


@pytest.fixture
def page(browser, live_server, transactional_db):
    context = browser.new_context(base_url=live_server.url, viewport=SCREEN)
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    yield page
    context.close()


def _rows_everywhere(alice) -> None:
    """A row or more in each table, with values as long as real ones get."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from clockq.jobs.periodic import ensure_periodic_tasks

    ensure_periodic_tasks(PeriodicTask, IntervalSchedule)  # an earlier test's flush may have left none
    job = submit(alice, tier="BP", name="nightly-embedding-refresh-for-the-search-index-v2")
    Job.objects.filter(pk=job.pk).update(
        last_error="RuntimeError: CUDA out of memory while allocating the optimizer state for layer 48 of 48"
    )
    submit(alice, tier="HP", name="fine-tune-llama-8b", workload="matmul", size=64, steps=10)
    control.apply_forecast(1.234, workers=2)  # closes admission: a decision row, and the state's reason
    now = timezone.now()
    MetricSample.objects.create(at=now, load_index=1.234, running_gpus=8, waiting_gpus=12, gpus=8, held=3)
    version = ModelVersion.objects.create(kind="lstm", is_champion=True, validation_mae=0.0123)
    Forecast.objects.create(at=now, horizon_s=900, value=1.2345, model="lstm", version=version, latency_ms=12.5)
    host = Host.objects.create(
        name="gpu-node-017.rack-b.example.internal",
        roles=["gpu", "beat"],
        broker="redis://redis.clockq.example.internal:6379/0",
        seen_at=now,
        drained_at=now,
        drained_by="operator-on-call",
        drain_reason="kernel upgrade",
    )
    GpuWorker.objects.create(name=f"gpu7@{host.name}", host=host, gpu_index=7, drained_at=now, drained_by="root")


def test_every_change_list_fits_a_1400_px_screen(page, alice, django_user_model):
    django_user_model.objects.create_superuser("root", "root@example.com", "root-pass-123")
    _rows_everywhere(alice)
    log_in(page, "/admin/login/?next=/admin/", "root", "root-pass-123")

    cut_off, measured = {}, set()
    for model in admin.site._registry:
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        page.goto(url)
        results = page.locator("#changelist .results")
        if results.count() == 0:  # an empty list has no table
            continue
        measured.add(model._meta.model_name)
        scroll, box = results.evaluate("e => [e.scrollWidth, e.clientWidth]")
        if scroll > box:
            cut_off[url] = f"{scroll} px in {box} px"
    assert {"job", "queuetier", "periodictask", "controldecision", "forecast", "host", "gpuworker"} <= measured
    assert not cut_off, "\n".join(f"{u}: {w}" for u, w in cut_off.items())
