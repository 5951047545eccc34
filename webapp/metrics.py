"""GET /metrics: clockq's figures in the Prometheus text format, read at scrape time.

Nothing is kept in the web process: a custom collector on a private registry reads the database
(jobs by state and tier, running jobs per GPU) and Redis (queue lengths, the event counters of
clockq/bus/counters.py, the latest GPU samples) on every scrape, so every gunicorn worker
answers with the same figures. The scrape is a handful of grouped queries over indexed columns
and a few Redis round trips; it never reads the Slice table.

Protected: `Authorization: Bearer <CLOCKQ_METRICS_TOKEN>`, or a staff login's session. Without
the setting, only staff sessions (a Prometheus server then gets 401). Not by client address:
behind a reverse proxy on the same host every client would look local.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterator

import redis
from django.conf import settings
from django.db.models import Count, Min
from django.http import HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from clockq.bus import counters, gpu_samples, heartbeat, queues
from clockq.bus.client import client
from clockq.control_state.control import admission
from clockq.forecasting import load_history
from clockq.jobs.models import Job, QueueTier
from clockq.policy.kpis import WAIT_BUCKETS_MS
from clockq.policy.slicing import SliceOutcome
from clockq.policy.states import TERMINAL_STATES, JobState
from clockq.policy.tiers import TIER_BY_CODE
from webapp.metrics_liveness import liveness_families

WORKER_NAME = re.compile(r"gpu(\d+)@(.+)")

# GpuSample field -> (metric name, help, factor to base units). Fields left None are not shown.
GPU_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("gpu_util", "clockq_gpu_utilization_ratio", "SM busy, 0-1.", 1.0),
    ("mem_util", "clockq_gpu_memory_bandwidth_utilization_ratio", "Memory controller busy, 0-1.", 1.0),
    ("mem_used_mib", "clockq_gpu_memory_used_bytes", "GPU memory in use.", 2**20),
    ("mem_total_mib", "clockq_gpu_memory_total_bytes", "GPU memory in all.", 2**20),
    ("pcie_tx_kbps", "clockq_gpu_pcie_tx_bytes_per_second", "PCIe transmit throughput.", 1024),
    ("pcie_rx_kbps", "clockq_gpu_pcie_rx_bytes_per_second", "PCIe receive throughput.", 1024),
    ("sm_clock_mhz", "clockq_gpu_sm_clock_hertz", "SM clock.", 1e6),
    ("power_w", "clockq_gpu_power_watts", "Power draw.", 1.0),
    ("temperature_c", "clockq_gpu_temperature_celsius", "GPU temperature.", 1.0),
    ("process_count", "clockq_gpu_processes", "Compute processes on the GPU.", 1.0),
    ("host_cpu", "clockq_host_cpu_utilization_ratio", "CPU load of the GPU's host, 0-1.", 1.0),
    ("host_mem", "clockq_host_memory_utilization_ratio", "Memory use of the GPU's host, 0-1.", 1.0),
    ("ts", "clockq_gpu_sample_timestamp_seconds", "When the GPU's latest sample was taken (Unix time).", 1.0),
)


class ClockqCollector(Collector):
    """Everything /metrics shows, read afresh from the database and Redis on each collect()."""

    def collect(self) -> Iterator[Metric]:
        tiers = [
            (tier_id, code, TIER_BY_CODE[code].queue_name, *rest)
            for tier_id, code, *rest in QueueTier.objects.values_list(
                "id", "code", "promote_to__code", "chance_to__code", "wait_target_ms"
            )
        ]
        code_of = {tier_id: code for tier_id, code, *_ in tiers}
        codes = [code for _id, code, *_ in tiers]
        yield from _job_families(code_of)
        yield _wait_targets(tiers)
        yield _oldest_waits(code_of)
        broker_up = GaugeMetricFamily("clockq_broker_up", "1 if the broker (Redis) answered this scrape, else 0.")
        try:
            found = counters.read_counters()
            waiting = queues.waiting_by_rank([queue for _id, _code, queue, *_ in tiers])
            samples = gpu_samples.cluster_samples(client())
            workers: list[dict] | None = heartbeat.live_workers()
        except redis.RedisError:
            # The database's figures still count; the broker's families are shown empty.
            found, waiting, samples, workers = None, None, [], None
        broker_up.add_metric([], 0 if found is None else 1)
        yield broker_up
        messages = GaugeMetricFamily(
            "clockq_broker_queue_messages",
            "Messages in each tier's broker queue (stale and duplicate ones included; the database is the truth).",
            labels=["tier", "queue"],
        )
        for (_id, code, queue, *_), n in zip(tiers, waiting or [], strict=False):
            messages.add_metric([code, queue], n)
        yield messages
        yield from _running_jobs(samples)
        yield from _gpu_telemetry(samples)
        yield from _counter_families(found or counters.Counters(), codes, tiers)
        yield from _control_families(None if workers is None else sum(1 for w in workers if w.get("gpu") is not None))
        yield from liveness_families(workers)


def _job_families(code_of: dict[int, str]) -> Iterator[Metric]:
    # One GROUP BY over the (state, tier) index gives both the state counts and the queue depth.
    rows = Job.objects.order_by().values_list("state", "tier_id").annotate(n=Count("id"))
    by_state_tier = {(state, code_of.get(tier_id, "?")): n for state, tier_id, n in rows}
    jobs = GaugeMetricFamily(
        "clockq_jobs", "Jobs in the database, by state and current tier.", labels=["state", "tier"]
    )
    depth = GaugeMetricFamily(
        "clockq_queue_depth",
        "Jobs waiting to run, by current tier (a promoted job counts in its higher tier).",
        labels=["tier"],
    )
    for code in code_of.values():
        for state in JobState:
            jobs.add_metric([state.value, code], by_state_tier.get((state.value, code), 0))
        depth.add_metric([code], by_state_tier.get((JobState.QUEUED.value, code), 0))
    yield jobs
    yield depth


def _running_jobs(samples: list[gpu_samples.GpuSample]) -> Iterator[Metric]:
    """Running jobs per GPU: every GPU that sends telemetry (0 when idle), and every worker the
    database names as running a job."""
    running = GaugeMetricFamily("clockq_running_jobs", "Jobs running on each GPU.", labels=["host", "gpu"])
    counts: dict[tuple[str, str], int] = {(s.host, str(s.gpu_index)): 0 for s in samples}
    rows = Job.objects.filter(state=JobState.RUNNING).order_by().values_list("worker").annotate(n=Count("id"))
    for worker, n in rows:
        match = WORKER_NAME.fullmatch(worker or "")
        key = (match.group(2), match.group(1)) if match else (worker or "unknown", "")
        counts[key] = counts.get(key, 0) + n
    for (host, gpu), n in sorted(counts.items()):
        running.add_metric([host, gpu], n)
    yield running


def _gpu_telemetry(samples: list[gpu_samples.GpuSample]) -> Iterator[Metric]:
    simulated = GaugeMetricFamily(
        "clockq_gpu_simulated", "1 if the GPU is simulated, 0 if real.", labels=["host", "gpu"]
    )
    for s in samples:
        simulated.add_metric([s.host, str(s.gpu_index)], int(s.simulated))
    yield simulated
    for attr, name, documentation, factor in GPU_GAUGES:
        family = GaugeMetricFamily(name, f"{documentation} Latest sample.", labels=["host", "gpu"])
        for s in samples:
            value = getattr(s, attr)
            if value is not None:
                family.add_metric([s.host, str(s.gpu_index)], value * factor)
        yield family


def _control_families(gpu_workers: int | None) -> Iterator[Metric]:
    """The load history's latest index and the control state: what an autoscaler (KEDA, or HPA
    through prometheus-adapter) acts on. A figure not known yet is left out."""
    latest = load_history.latest_sample()
    state = admission()
    index = GaugeMetricFamily(
        "clockq_load_index",
        "Load index of the latest load sample: (busy GPUs + waiting GPU demand) / GPUs, 0-2.",
    )
    if latest is not None and latest.load_index is not None:
        index.add_metric([], latest.load_index)
    yield index
    forecast = GaugeMetricFamily("clockq_load_forecast", "The latest forecast of the load index, 15 minutes ahead.")
    age = GaugeMetricFamily("clockq_load_forecast_age_seconds", "Seconds since the latest forecast was made.")
    if state.forecast is not None:
        forecast.add_metric([], state.forecast)
    if state.forecast_at is not None:
        age.add_metric([], max((timezone.now() - state.forecast_at).total_seconds(), 0.0))
    yield forecast
    yield age
    desired = GaugeMetricFamily(
        "clockq_desired_gpu_workers",
        "GPU workers the controller wants (scale-out above 70% forecast load); the live GPU workers before any "
        "forecast.",
    )
    wanted = state.desired_workers if state.desired_workers is not None else gpu_workers
    if wanted is not None:
        desired.add_metric([], wanted)
    yield desired
    yield GaugeMetricFamily(
        "clockq_admission_open",
        "1 while new non-RT jobs are admitted, 0 while they are held.",
        value=int(state.admission_open),
    )
    yield GaugeMetricFamily(
        "clockq_prefetch_on", "1 while GPU hosts prefetch queued jobs' data.", value=int(state.prefetch_on)
    )
    yield GaugeMetricFamily(
        "clockq_control_forced", "1 while an operator's override holds the control state.", value=int(state.forced)
    )


def _counter_families(found: counters.Counters, codes: list[str], tiers: list[tuple]) -> Iterator[Metric]:
    slices = CounterMetricFamily(
        "clockq_slices", "Slices ended, by the job's own tier and outcome.", labels=["tier", "outcome"]
    )
    busy = CounterMetricFamily(
        "clockq_slice_busy_seconds",
        "GPU time held by slices, by the job's own tier and outcome.",
        labels=["tier", "outcome"],
    )
    seen_tiers = codes + sorted({tier for tier, _ in found.slices} - set(codes))
    for tier in seen_tiers:
        for outcome in SliceOutcome:
            slices.add_metric([tier, outcome.value], found.slices.get((tier, outcome.value), 0))
            busy.add_metric([tier, outcome.value], found.slice_ms.get((tier, outcome.value), 0.0) / 1000)
    yield slices
    yield busy
    yield _histogram(
        "clockq_switch_cost_seconds",
        "Checkpoint plus restore time of slices that made way for another job, by the job's own tier.",
        found.switch,
        counters.SWITCH_BUCKETS_MS,
        codes,
    )
    yield _histogram(
        "clockq_job_first_wait_seconds",
        "Wait from submission to the first start, by the job's own tier.",
        found.wait,
        WAIT_BUCKETS_MS,
        codes,
    )
    promotions = CounterMetricFamily(
        "clockq_promotions",
        "Jobs lifted to a more urgent tier: starved (the promotion tick), batch_chance or by_hand.",
        labels=["from_tier", "to_tier", "kind"],
    )
    # The configured routes show 0 before their first use; others appear once used.
    routes = {(code, to, "starved"): 0 for _id, code, _q, to, _c, _t in tiers if to}
    routes |= {(code, to, "batch_chance"): 0 for _id, code, _q, _p, to, _t in tiers if to}
    for (from_tier, to_tier, kind), n in sorted((routes | found.promotions).items()):
        promotions.add_metric([from_tier, to_tier, kind], n)
    yield promotions
    yield _job_ends(found, codes)


def _job_ends(found: counters.Counters, codes: list[str]) -> Metric:
    ends = CounterMetricFamily(
        "clockq_jobs_ended",
        "Jobs that ended, by their own tier, terminal state and whether they were on time (the KPIs' definition).",
        labels=["tier", "state", "on_time"],
    )
    # Every tier's ends show 0 before the first; only a success can be on time.
    shown = {(code, state.value, False): 0 for code in codes for state in TERMINAL_STATES}
    shown |= {(code, JobState.SUCCEEDED.value, True): 0 for code in codes}
    for (tier, state, on_time), n in sorted((shown | found.ends).items()):
        ends.add_metric([tier, state, "true" if on_time else "false"], n)
    return ends


def _oldest_waits(code_of: dict[int, str]) -> Metric:
    """The wait the SLO measures (submission to first start) of the longest-waiting job that
    has not started yet, per own tier: a tier falling behind shows here before its jobs start."""
    oldest = GaugeMetricFamily(
        "clockq_queue_oldest_wait_seconds",
        "How long the longest-waiting job that has not started yet has waited since submission, by its own "
        "tier; 0 when none waits.",
        labels=["tier"],
    )
    never_started = Job.objects.filter(state=JobState.QUEUED, first_started_at__isnull=True).order_by()
    rows = never_started.values_list("original_tier_id").annotate(since=Min("submitted_at"))
    since = {code_of.get(tier_id, "?"): at for tier_id, at in rows}
    now = timezone.now()
    for code in code_of.values():
        at = since.get(code)
        oldest.add_metric([code], 0.0 if at is None else max((now - at).total_seconds(), 0.0))
    return oldest


def _wait_targets(tiers: list[tuple]) -> Metric:
    targets = GaugeMetricFamily(
        "clockq_tier_wait_target_seconds",
        "Each tier's target wait before a job's first start (its SLO; the tiers' settings). A best-effort "
        "tier has none.",
        labels=["tier"],
    )
    for _id, code, *_, target_ms in tiers:
        if target_ms is not None:
            targets.add_metric([code], target_ms / 1000)
    return targets


def _histogram(
    name: str, documentation: str, found: dict[str, counters.Histogram], bounds_ms, codes: list[str]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=["tier"])
    for tier in codes + sorted(set(found) - set(codes)):
        histogram = found.get(tier) or counters.Histogram([0] * (len(bounds_ms) + 1))
        cumulative = histogram.cumulative()
        buckets = [(floatToGoString(b / 1000), cumulative[i]) for i, b in enumerate(bounds_ms)]
        # +Inf is the count, so the two always agree even if a bucket field was lost.
        buckets.append(("+Inf", max(histogram.count, cumulative[-1])))
        family.add_metric([tier], buckets, histogram.sum / 1000)
    return family


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(ClockqCollector())


@require_GET
@never_cache
def metrics(request):
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)


def _refusal(request) -> HttpResponse | None:
    """None if the caller may read the metrics: the right bearer token, or a staff session."""
    if request.headers.get("Authorization", ""):
        return None if bears_metrics_token(request) else _plain(403, "wrong metrics token")
    if request.user.is_authenticated:
        return None if request.user.is_staff else _plain(403, "metrics are for staff")
    response = _plain(401, "send Authorization: Bearer <CLOCKQ_METRICS_TOKEN>, or log in as staff")
    response["WWW-Authenticate"] = 'Bearer realm="clockq metrics"'
    return response


def bears_metrics_token(request) -> bool:
    """Whether the request carries `Authorization: Bearer <CLOCKQ_METRICS_TOKEN>` (the setting set)."""
    expected = settings.CLOCKQ_METRICS_TOKEN
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return (
        bool(expected) and scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected.encode())
    )


def _plain(status: int, text: str) -> HttpResponse:
    return HttpResponse(text + "\n", status=status, content_type="text/plain; charset=utf-8")
