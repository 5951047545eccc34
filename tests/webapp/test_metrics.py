"""GET /metrics: Prometheus text read at scrape time from the database and a real Redis, and who may read it."""

from __future__ import annotations

import math

import pytest
import redis
from django.db.models import Sum
from prometheus_client.parser import text_string_to_metric_families
from redis.backoff import NoBackoff
from redis.retry import Retry

from clockq.bus import counters
from clockq.bus.client import client as broker
from clockq.bus.gpu_samples import GpuSample, publish
from clockq.jobs.models import Job, Slice
from clockq.jobs.promotion import give_batch_chance, promote_job
from clockq.policy.kpis import WAIT_BUCKETS_MS
from clockq.policy.slicing import SliceOutcome
from tests.harness import free_port, wait_for
from tests.helpers import submit, wait_finished

TOKEN = "metrics-token-for-the-tests-0123456789"
BEARER = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}

FAMILIES = {
    "clockq_queue_depth": "gauge",
    "clockq_broker_queue_messages": "gauge",
    "clockq_broker_up": "gauge",
    "clockq_running_jobs": "gauge",
    "clockq_jobs": "gauge",
    "clockq_job_first_wait_seconds": "histogram",
    "clockq_slices": "counter",
    "clockq_slice_busy_seconds": "counter",
    "clockq_switch_cost_seconds": "histogram",
    "clockq_promotions": "counter",
    "clockq_gpu_simulated": "gauge",
    "clockq_gpu_utilization_ratio": "gauge",
    "clockq_gpu_memory_used_bytes": "gauge",
    "clockq_gpu_memory_total_bytes": "gauge",
    "clockq_gpu_temperature_celsius": "gauge",
    "clockq_gpu_power_watts": "gauge",
    "clockq_gpu_sample_timestamp_seconds": "gauge",
}


@pytest.fixture(autouse=True)
def _token_and_awake_counters(settings, monkeypatch):
    settings.CLOCKQ_METRICS_TOKEN = TOKEN
    monkeypatch.setattr(counters, "_quiet_until", -math.inf)


class Scrape:
    """One parsed /metrics answer."""

    def __init__(self, text: str):
        self.families = {f.name: f for f in text_string_to_metric_families(text)}

    def value(self, sample: str, **labels: str) -> float:
        """The one sample called `sample` whose labels include `labels`."""
        family = self.families[_family_of(sample, self.families)]
        found = [s.value for s in family.samples if s.name == sample and labels.items() <= s.labels.items()]
        assert len(found) == 1, f"{sample}{labels}: {len(found)} samples"
        return found[0]

    def labelled(self, sample: str) -> dict[tuple, float]:
        family = self.families[_family_of(sample, self.families)]
        return {tuple(sorted(s.labels.items())): s.value for s in family.samples if s.name == sample}


def _family_of(sample: str, families) -> str:
    for suffix in ("", "_total", "_bucket", "_count", "_sum"):
        if suffix and sample.endswith(suffix) and sample[: -len(suffix)] in families:
            return sample[: -len(suffix)]
        if not suffix and sample in families:
            return sample
    raise KeyError(sample)


def scrape(http, **headers) -> Scrape:
    response = http.get("/metrics", **(headers or BEARER))
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"].startswith("text/plain; version=")
    return Scrape(response.content.decode())


# --- the figures -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_metrics_hold_every_family_with_the_fixtures_figures(client, alice, carol, django_capture_on_commit_callbacks):
    # Given jobs in the database: 2 SP and 1 HP waiting, 2 running on hostA's GPU 0 and 1 on GPU 1, 1 done
    waiting_sp = [submit(alice, "SP", f"sp{i}") for i in range(2)]
    submit(alice, "HP", "hp")
    for name, worker in (("r1", "gpu0@hostA"), ("r2", "gpu0@hostA"), ("r3", "gpu1@hostA")):
        Job.objects.filter(pk=submit(alice, "BP", name).pk).update(state="running", worker=worker)
    Job.objects.filter(pk=submit(alice, "BK", "done").pk).update(state="succeeded")
    # ... three stale messages in the broker's sp queue, and telemetry of three GPUs
    r = broker()
    r.rpush("sp", "a", "b", "c")
    publish(r, GpuSample("hostA", 0, 1700000000.0, True, gpu_util=0.5, mem_used_mib=1024, mem_total_mib=16384))
    publish(r, GpuSample("hostA", 1, 1700000001.0, False, temperature_c=61.0, power_w=250.5))
    publish(r, GpuSample("hostB", 0, 1700000002.0, True, gpu_util=0.0))
    # ... and events counted as the workers and the promotion services count them
    with django_capture_on_commit_callbacks(execute=True):
        counters.count_first_start(tier="SP", wait_ms=40)  # <= 50 ms
        counters.count_first_start(tier="SP", wait_ms=90_000)  # <= 2 min
        for outcome, used_ms, switch_ms in (("continued", 50, None), ("yielded", 48, 6.0), ("completed", 20, None)):
            counters.count_slice(tier="SP", outcome=outcome, used_ms=used_ms, switch_ms=switch_ms)
        promote_job(waiting_sp[0], actor="carol")  # SP -> HP by hand
        counters.count_promotion(from_tier="SP", to_tier="HP", actor="promotion tick")

    # When Prometheus scrapes
    m = scrape(client)

    # Then every family is there, with its type
    assert {name: m.families[name].type for name in FAMILIES} == FAMILIES
    # Queue depth per tier (the promoted job now waits in HP) and the broker's queue lengths
    assert [m.value("clockq_queue_depth", tier=t) for t in ("RT", "HP", "SP", "BP", "BK")] == [0, 2, 1, 0, 0]
    assert m.value("clockq_broker_queue_messages", tier="SP", queue="sp") == 3
    assert m.value("clockq_broker_up") == 1
    # Job state counts
    assert m.value("clockq_jobs", state="running", tier="BP") == 3
    assert m.value("clockq_jobs", state="succeeded", tier="BK") == 1
    assert sum(m.labelled("clockq_jobs").values()) == 7
    # Running jobs per GPU, idle GPUs included
    assert m.labelled("clockq_running_jobs") == {
        (("gpu", "0"), ("host", "hostA")): 2,
        (("gpu", "1"), ("host", "hostA")): 1,
        (("gpu", "0"), ("host", "hostB")): 0,
    }
    # Wait histogram of SP: one wait in the first bucket, both by 2 minutes
    assert m.value("clockq_job_first_wait_seconds_bucket", tier="SP", le="0.05") == 1
    assert m.value("clockq_job_first_wait_seconds_bucket", tier="SP", le="60.0") == 1
    assert m.value("clockq_job_first_wait_seconds_bucket", tier="SP", le="120.0") == 2
    assert m.value("clockq_job_first_wait_seconds_bucket", tier="SP", le="+Inf") == 2
    assert m.value("clockq_job_first_wait_seconds_count", tier="SP") == 2
    assert m.value("clockq_job_first_wait_seconds_sum", tier="SP") == pytest.approx(90.04)
    assert m.value("clockq_job_first_wait_seconds_count", tier="RT") == 0
    assert len([s for s in m.families["clockq_job_first_wait_seconds"].samples if s.labels.get("tier") == "RT"]) == (
        len(WAIT_BUCKETS_MS) + 1 + 2
    )
    # Slice outcomes, every outcome shown
    assert m.value("clockq_slices_total", tier="SP", outcome="yielded") == 1
    assert m.value("clockq_slices_total", tier="SP", outcome="lost") == 0
    assert m.value("clockq_slice_busy_seconds_total", tier="SP", outcome="continued") == pytest.approx(0.05)
    assert {dict(k)["outcome"] for k in m.labelled("clockq_slices_total")} == {o.value for o in SliceOutcome}
    # Switch cost of the one yielded slice
    assert m.value("clockq_switch_cost_seconds_bucket", tier="SP", le="0.005") == 0
    assert m.value("clockq_switch_cost_seconds_bucket", tier="SP", le="0.01") == 1
    assert m.value("clockq_switch_cost_seconds_sum", tier="SP") == pytest.approx(0.006)
    # Promotions: by hand and by the tick; the configured batch chance route shows 0
    assert m.value("clockq_promotions_total", from_tier="SP", to_tier="HP", kind="by_hand") == 1
    assert m.value("clockq_promotions_total", from_tier="SP", to_tier="HP", kind="starved") == 1
    assert m.value("clockq_promotions_total", from_tier="BP", to_tier="SP", kind="batch_chance") == 0
    # GPU telemetry, in base units; a reading a GPU did not give is left out
    assert m.value("clockq_gpu_utilization_ratio", host="hostA", gpu="0") == 0.5
    assert m.value("clockq_gpu_memory_used_bytes", host="hostA", gpu="0") == 1024 * 2**20
    assert m.value("clockq_gpu_temperature_celsius", host="hostA", gpu="1") == 61.0
    assert m.value("clockq_gpu_power_watts", host="hostA", gpu="1") == 250.5
    assert m.value("clockq_gpu_simulated", host="hostA", gpu="1") == 0
    assert m.value("clockq_gpu_sample_timestamp_seconds", host="hostB", gpu="0") == 1700000002.0
    assert ("gpu", "1") not in {k[0] for k in m.labelled("clockq_gpu_utilization_ratio")}


@pytest.mark.django_db
def test_a_batch_chance_is_counted_as_one(client, alice, django_capture_on_commit_callbacks):
    submit(alice, "BP", "batch")
    with django_capture_on_commit_callbacks(execute=True):
        assert give_batch_chance("BP") == 1

    m = scrape(client)

    assert m.value("clockq_promotions_total", from_tier="BP", to_tier="SP", kind="batch_chance") == 1
    assert m.value("clockq_queue_depth", tier="SP") == 1


@pytest.mark.django_db
def test_with_the_broker_down_the_database_figures_still_come(client, alice, monkeypatch):
    submit(alice, "SP", "waiting")
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    monkeypatch.setattr("webapp.metrics.client", lambda: dead)
    monkeypatch.setattr("clockq.bus.counters.client", lambda: dead)

    m = scrape(client)

    assert m.value("clockq_broker_up") == 0
    assert m.value("clockq_queue_depth", tier="SP") == 1
    assert m.families["clockq_broker_queue_messages"].samples == []
    assert m.value("clockq_slices_total", tier="SP", outcome="completed") == 0


@pytest.mark.django_db
def test_the_load_and_control_gauges_an_autoscaler_reads(client):
    from datetime import timedelta

    from django.utils import timezone

    from clockq.bus import heartbeat
    from clockq.control_state.control import apply_forecast, force_state
    from clockq.forecasting.models import MetricSample

    # Before any sample or forecast: the wanted GPU workers are those alive, admission is open
    for name, gpu in (("gpu0@h", 0), ("gpu1@h", 1), ("control@h", None)):
        heartbeat.announce(broker(), {"hostname": name, "gpu": gpu})
    m = scrape(client)
    assert m.value("clockq_desired_gpu_workers") == 2
    assert (m.value("clockq_admission_open"), m.value("clockq_prefetch_on"), m.value("clockq_control_forced")) == (
        1,
        0,
        0,
    )
    for name in ("clockq_load_index", "clockq_load_forecast", "clockq_load_forecast_age_seconds"):
        assert m.families[name].type == "gauge" and m.families[name].samples == []

    # A sample, then a forecast above every threshold 90 s ago
    now = timezone.now()
    MetricSample.objects.create(at=now - timedelta(seconds=120), load_index=0.5, gpus=2)
    MetricSample.objects.create(at=now - timedelta(seconds=60), load_index=0.75, gpus=2)
    apply_forecast(0.91, at=now - timedelta(seconds=90), workers=2)
    m = scrape(client)
    assert m.value("clockq_load_index") == 0.75  # the latest
    assert m.value("clockq_load_forecast") == 0.91
    assert 90 <= m.value("clockq_load_forecast_age_seconds") < 120
    assert m.value("clockq_desired_gpu_workers") == 3  # ceil(2 x 0.91 / 0.70)
    assert (m.value("clockq_admission_open"), m.value("clockq_prefetch_on")) == (0, 0)

    # An operator's override shows as it is
    force_state(actor="op", admission_open=True, prefetch_on=True, desired_workers=7)
    m = scrape(client)
    assert (m.value("clockq_admission_open"), m.value("clockq_prefetch_on")) == (1, 1)
    assert (m.value("clockq_desired_gpu_workers"), m.value("clockq_control_forced")) == (7, 1)


# --- real workers ------------------------------------------------------------------------------------


@pytest.mark.integration
def test_slices_run_by_real_workers_move_the_counters(start_workers, client, alice):
    # Given two SP jobs taking turns on one GPU
    start_workers(gpus=1, CLOCKQ_OVERHEAD_BUDGET="0")
    a = submit(alice, "SP", "a", steps=20, step_ms=10, state_kb=4)
    b = submit(alice, "SP", "b", steps=20, step_ms=10, state_kb=4)
    a, b = wait_finished(a, b)
    slices = Slice.objects.all()
    by_outcome = {o.value: slices.filter(outcome=o).count() for o in SliceOutcome}
    assert by_outcome["completed"] == 2 and by_outcome["yielded"] >= 1

    # When Prometheus scrapes (a worker counts a slice just after its commit: allow it a moment)
    def counted() -> Scrape | None:
        m = scrape(client)
        shown = {o: m.value("clockq_slices_total", tier="SP", outcome=o) for o in by_outcome}
        waits = m.value("clockq_job_first_wait_seconds_count", tier="SP")
        ends = m.value("clockq_jobs_ended_total", tier="SP", state="succeeded", on_time="true")
        return m if shown == by_outcome and waits == 2 and ends == 2 else None

    m = wait_for(counted, 10, what="the slice counters to match the Slice rows")

    # Then the counters agree with the Slice rows and the jobs
    used_s = (slices.aggregate(ms=Sum("used_ms"))["ms"]) / 1000
    assert sum(m.value("clockq_slice_busy_seconds_total", tier="SP", outcome=o) for o in by_outcome) == pytest.approx(
        used_s
    )
    yielded = slices.filter(outcome="yielded")
    switch_s = sum(s.checkpoint_ms + s.restore_ms for s in yielded) / 1000
    assert m.value("clockq_switch_cost_seconds_count", tier="SP") == yielded.count()
    assert m.value("clockq_switch_cost_seconds_sum", tier="SP") == pytest.approx(switch_s)
    assert m.value("clockq_job_first_wait_seconds_sum", tier="SP") == pytest.approx(
        (a.first_wait_ms + b.first_wait_ms) / 1000
    )
    assert m.value("clockq_queue_depth", tier="SP") == 0
    assert m.value("clockq_jobs", state="succeeded", tier="SP") == 2
    # The worker's GPU reports telemetry, and runs nothing now
    assert m.value("clockq_gpu_simulated", gpu="0") == 1
    assert set(m.labelled("clockq_running_jobs").values()) == {0}


# --- who may read it -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_without_credentials_it_is_401_with_a_bearer_challenge(client):
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"clockq_" not in response.content


@pytest.mark.django_db
@pytest.mark.parametrize(
    "header",
    [
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        "Bearer ",
        f"Token {TOKEN}",  # the API's scheme is not this one's
        f"Basic {TOKEN}",
    ],
)
def test_a_wrong_token_is_403(client, header):
    response = client.get("/metrics", HTTP_AUTHORIZATION=header)
    assert response.status_code == 403
    assert b"clockq_" not in response.content


@pytest.mark.django_db
def test_the_right_token_is_200(client):
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"bearer  {TOKEN} ").status_code == 200


@pytest.mark.django_db
def test_staff_may_read_it_in_the_browser_and_others_may_not(client, alice, carol):
    client.force_login(alice)
    assert client.get("/metrics").status_code == 403
    client.force_login(carol)
    assert client.get("/metrics").status_code == 200


@pytest.mark.django_db
def test_without_a_token_setting_only_staff_sessions_get_in(client, carol, settings):
    settings.CLOCKQ_METRICS_TOKEN = None
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer None").status_code == 403
    # Loopback is no pass: behind a proxy on the same host, every client is 127.0.0.1
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 401
    client.force_login(carol)
    assert client.get("/metrics").status_code == 200


@pytest.mark.django_db
def test_it_only_answers_get(client):
    assert client.post("/metrics", **BEARER).status_code == 405
    assert client.put("/metrics", **BEARER).status_code == 405


def test_the_autoscaler_examples_query_the_gauge_we_serve():
    import yaml

    from tests.harness import ROOT

    autoscaling = ROOT / "compose/kubernetes/autoscaling"
    keda = yaml.safe_load((autoscaling / "keda-scaledobject.yaml").read_text())
    [trigger] = keda["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and "clockq_desired_gpu_workers" in trigger["metadata"]["query"]
    assert trigger["metadata"]["ignoreNullValues"] == "false"
    adapter = yaml.safe_load((autoscaling / "prometheus-adapter-values.yaml").read_text())
    hpa = yaml.safe_load((autoscaling / "hpa.yaml").read_text())
    assert adapter["rules"]["external"][0]["name"]["as"] == "clockq_desired_gpu_workers"
    assert hpa["spec"]["metrics"][0]["external"]["metric"]["name"] == "clockq_desired_gpu_workers"
