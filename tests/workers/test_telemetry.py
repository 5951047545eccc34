"""GPU telemetry: NVML failures handled without a GPU, simulated probes, slice sampling, and the
cluster view through a real Redis."""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time

import pynvml
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from rest_framework.test import APIRequestFactory, force_authenticate

from workers import broker, telemetry
from workers.telemetry import (
    GpuSample,
    NvmlProbe,
    Publisher,
    RateLimitedWarnings,
    SimulatedProbe,
    SliceSampler,
    cluster_samples,
    make_probe,
    nvml_status,
    publish,
)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def warnings(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == logging.WARNING]


@pytest.fixture
def telemetry_log():
    """The `clockq` logger does not propagate (settings.LOGGING), so caplog would miss it."""
    handler = Records()
    logger = logging.getLogger("clockq.telemetry")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


@pytest.fixture
def fresh_nvml():
    """Forget this process's NVML init state before and after the test."""
    telemetry._nvml.reset()
    yield
    telemetry._nvml.reset()


def nvml_works() -> bool:
    return nvml_status()["available"]


def sample(**overrides) -> GpuSample:
    base = dict(host="h1", gpu_index=0, ts=1700000000.5, simulated=True, gpu_util=0.5, mem_util=0.3, error=None)
    return GpuSample(**{**base, **overrides})


# --- NVML on a machine without a GPU --------------------------------------------------------


def test_nvml_probe_without_gpu_reports_the_error_and_logs_it_once(telemetry_log):
    if nvml_works():
        pytest.skip("NVML works on this machine")
    probe = NvmlProbe(0)
    assert probe.open_error and "NVML" in probe.open_error
    samples = [probe.sample() for _ in range(20)]
    for s in samples:
        assert s.error and "NVML" in s.error and not s.simulated
        assert s.gpu_util is None and s.mem_total_mib is None and s.power_w is None
        assert s.host and s.gpu_index == 0 and s.host_mem is not None
    assert probe.free_memory_mib() is None
    assert len(telemetry_log.warnings) == 1, telemetry_log.warnings
    assert "GPU 0 telemetry" in telemetry_log.warnings[0]


def test_nvml_init_failure_is_carried_not_switched_to_simulated(monkeypatch, fresh_nvml):
    def driver_not_loaded():
        raise pynvml.NVMLError_DriverNotLoaded()

    monkeypatch.setattr(pynvml, "nvmlInit", driver_not_loaded)
    probe = make_probe(3, simulated=False, memory_total_mib=8192)
    assert isinstance(probe, NvmlProbe) and not probe.simulated
    s = probe.sample()
    assert s.error == "NVML unavailable: Driver Not Loaded" and s.gpu_index == 3 and s.gpu_util is None
    status = nvml_status()
    assert status == {"available": False, "error": "NVML unavailable: Driver Not Loaded", "driver": None, "gpus": 0}


def test_each_failing_nvml_query_leaves_its_field_empty_and_names_itself(monkeypatch):
    """Failure injection on the per-field path: every query is made, each failure recorded."""

    def not_supported(*args):
        raise pynvml.NVMLError_NotSupported()

    def gpu_lost(*args):
        raise pynvml.NVMLError_GpuIsLost()

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", not_supported)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPcieThroughput", not_supported)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", gpu_lost)
    probe = NvmlProbe(0)
    values, errors = probe._read(object(), include_slow=True)
    assert "power: Not Supported" in errors and "temperature: GPU is lost" in errors
    assert "pcie tx: Not Supported" in errors and "pcie rx: Not Supported" in errors
    assert values["power_w"] is None and values["temperature_c"] is None and values["pcie_tx_kbps"] is None
    # Every other query ran too, and (without a GPU) failed on its own.
    labels = {e.split(":")[0] for e in errors}
    assert {"utilization", "memory", "sm clock", "processes"} <= labels or nvml_works()
    # The slow PCIe pair is not re-queried within its interval, but its error is still reported.
    calls = []
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPcieThroughput", lambda *a: calls.append(a))
    _values, errors = probe._read(object(), include_slow=True)
    assert calls == [] and "pcie tx: Not Supported" in errors


def test_a_probe_never_raises_even_on_unexpected_errors(monkeypatch):
    probe = NvmlProbe(0)
    monkeypatch.setattr(probe, "_open", lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    s = probe.sample()
    assert s.error == "telemetry failed: RuntimeError('boom')"


def test_warnings_are_rate_limited_per_text():
    handler = Records()
    logger = logging.getLogger("test.telemetry.ratelimit")
    logger.addHandler(handler)
    now = [100.0]
    limiter = RateLimitedWarnings(logger, every_s=60.0, clock=lambda: now[0])
    assert limiter.warn("GPU lost") and not limiter.warn("GPU lost")
    assert limiter.warn("other text")
    now[0] += 59.0
    assert not limiter.warn("GPU lost")
    now[0] += 2.0
    assert limiter.warn("GPU lost")
    assert handler.warnings == ["GPU lost", "other text", "GPU lost"]
    logger.removeHandler(handler)


def test_nvml_status_on_this_machine():
    status = nvml_status()
    assert set(status) == {"available", "error", "driver", "gpus"}
    if status["available"]:
        assert status["error"] is None and status["driver"] and status["gpus"] >= 0
    else:
        assert "NVML" in status["error"] and status["driver"] is None and status["gpus"] == 0


# --- simulated GPUs -------------------------------------------------------------------------


def test_simulated_probe_reports_the_declared_load():
    probe = make_probe(1, simulated=True, memory_total_mib=8192)
    assert isinstance(probe, SimulatedProbe)
    idle = probe.sample()
    assert idle.simulated and idle.error is None and idle.gpu_index == 1
    assert idle.gpu_util == 0.0 and idle.process_count == 0 and idle.sm_clock_mhz == 210
    assert idle.power_w == 60.0 and idle.temperature_c == 35.0 and idle.mem_total_mib == 8192
    probe.set_load(0.75, mem_used_mib=3000)
    busy = probe.sample()
    assert busy.gpu_util == 0.75 and busy.mem_util == pytest.approx(0.45)
    assert busy.power_w == pytest.approx(240.0) and busy.temperature_c == pytest.approx(65.0)
    assert busy.sm_clock_mhz == 1980 and busy.process_count == 1 and busy.mem_used_mib == 3000
    assert probe.free_memory_mib() == 5192
    # Deterministic: the same load gives the same GPU readings.
    again = probe.sample()
    gpu_fields = ("gpu_util", "mem_util", "mem_used_mib", "pcie_tx_kbps", "power_w", "temperature_c")
    assert [getattr(again, f) for f in gpu_fields] == [getattr(busy, f) for f in gpu_fields]
    probe.set_load(None)
    assert probe.sample().gpu_util == 0.0 and probe.free_memory_mib() == 8192
    probe.set_load(0.5, mem_used_mib=10**9)  # clamped to the GPU's memory
    assert probe.free_memory_mib() == 0
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError):
            probe.set_load(bad)


# --- sampling a slice -----------------------------------------------------------------------


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_slice_sampler_averages_over_a_slice_whose_load_changes():
    probe = SimulatedProbe(0)
    with SliceSampler(probe, interval_s=0.002) as sampler:
        probe.set_load(0.9)
        sampler.start()
        wait_for(lambda: sampler.samples_taken >= 5)
        probe.set_load(0.1)
        seen = sampler.samples_taken
        wait_for(lambda: sampler.samples_taken >= seen + 6)
        stats = sampler.stop()
    assert stats.samples >= 11 and stats.errors == 0
    assert 0.1 < stats.mean_gpu_util < 0.9 and stats.max_gpu_util == 0.9
    assert stats.last.gpu_util == 0.1 and sampler.latest == stats.last


def test_slice_sampler_takes_a_sample_even_for_a_1ms_slice_and_reuses_one_thread():
    probe = SimulatedProbe(0)
    probe.set_load(0.4)
    sampler = SliceSampler(probe, interval_s=10.0)
    threads = set()
    try:
        for _ in range(5):
            sampler.start()
            time.sleep(0.001)
            stats = sampler.stop()
            assert stats.samples >= 1 and stats.mean_gpu_util == 0.4
            threads.add(sampler._thread.ident)
        assert len(threads) == 1
        assert sum(t.name.startswith("clockq-telemetry-gpu0") for t in threading.enumerate()) >= 1
        with pytest.raises(RuntimeError):
            sampler.stop()
        sampler.start()
        with pytest.raises(RuntimeError):
            sampler.start()
        sampler.stop()
    finally:
        sampler.close()
    assert not sampler._thread.is_alive()


def test_slice_sampler_without_nvml_reports_errors_not_utilisation():
    with SliceSampler(NvmlProbe(0), interval_s=0.002) as sampler:
        sampler.start()
        time.sleep(0.01)
        stats = sampler.stop()
    if not nvml_works():
        assert stats.samples >= 1 and stats.errors == stats.samples and stats.mean_gpu_util is None


def test_slice_sampler_start_and_stop_cost_the_caller_little():
    """Arming and disarming per 20-50 ms slice must stay far below the slice itself."""
    probe = SimulatedProbe(0)
    probe.set_load(0.9)
    with SliceSampler(probe) as sampler:
        sampler.start()
        sampler.stop()  # the one-time thread start is not part of the per-slice cost
        costs = []
        for _ in range(60):
            t0 = time.perf_counter()
            sampler.start()
            t1 = time.perf_counter()
            wait_for(lambda: sampler.samples_taken >= 1)  # the slice runs; the thread samples
            t2 = time.perf_counter()
            sampler.stop()
            t3 = time.perf_counter()
            costs.append((t1 - t0) + (t3 - t2))
        # Worst case: a slice so short the thread took no sample, so stop() samples itself.
        short = []
        for _ in range(60):
            t0 = time.perf_counter()
            sampler.start()
            sampler.stop()
            short.append(time.perf_counter() - t0)
    assert statistics.median(costs) < 0.001, costs
    assert statistics.median(short) < 0.002, short


# --- the sample as data ---------------------------------------------------------------------


def test_sample_round_trips_through_a_dict_and_ignores_unknown_keys():
    s = SimulatedProbe(2).sample()
    assert GpuSample.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert GpuSample.from_dict({**s.to_dict(), "from_a_newer_version": [1, 2]}) == s
    minimal = GpuSample.from_dict({"host": "h", "gpu_index": 0, "ts": 1, "simulated": False})
    assert minimal.gpu_util is None and minimal.ts == 1.0 and isinstance(minimal.ts, float)


@pytest.mark.parametrize(
    "data",
    [
        None,
        "a string",
        [1, 2],
        {"gpu_index": 0, "ts": 1.0, "simulated": True},  # no host
        {"host": "", "gpu_index": 0, "ts": 1.0, "simulated": True},
        {"host": 5, "gpu_index": 0, "ts": 1.0, "simulated": True},
        {"host": "h", "gpu_index": "0", "ts": 1.0, "simulated": True},
        {"host": "h", "gpu_index": True, "ts": 1.0, "simulated": True},
        {"host": "h", "gpu_index": -1, "ts": 1.0, "simulated": True},
        {"host": "h", "gpu_index": 0, "ts": "now", "simulated": True},
        {"host": "h", "gpu_index": 0, "ts": float("nan"), "simulated": True},
        {"host": "h", "gpu_index": 0, "ts": 1.0, "simulated": "yes"},
        {"host": "h", "gpu_index": 0, "ts": 1.0, "simulated": True, "gpu_util": 1.5},
        {"host": "h", "gpu_index": 0, "ts": 1.0, "simulated": True, "gpu_util": float("inf")},
        {"host": "h", "gpu_index": 0, "ts": 1.0, "simulated": True, "mem_used_mib": 1.5},
        {"host": "h", "gpu_index": 0, "ts": 1.0, "simulated": True, "power_w": -3},
        {"host": "h", "gpu_index": 0, "ts": 1.0, "simulated": True, "error": {"x": 1}},
        {"host": "h" * 300, "gpu_index": 0, "ts": 1.0, "simulated": True},
    ],
)
def test_from_dict_rejects_garbage(data):
    with pytest.raises(ValueError):
        GpuSample.from_dict(data)


# --- the cluster view through Redis ---------------------------------------------------------


def test_publish_and_cluster_samples_round_trip_through_redis():
    r = broker.client()
    b1, a0, a1 = sample(host="b", gpu_index=1), sample(host="a", gpu_index=0), sample(host="a", gpu_index=1)
    for s in (b1, a1, a0):
        publish(r, s)
    r.set("clockq:gpu:evil:0", b"not json", ex=15)
    r.set("clockq:gpu:evil:1", json.dumps({"host": "evil", "gpu_index": "x"}), ex=15)
    r.set("clockq:gpu:evil:2", b"\xff\xfe", ex=15)
    r.set("clockq:other", "untouched")
    assert cluster_samples(r) == [a0, a1, b1]
    ttl = r.ttl("clockq:gpu:a:0")
    assert 0 < ttl <= telemetry.TTL_S
    assert json.loads(r.get("clockq:gpu:b:1")) == b1.to_dict()


def test_many_gpus_are_read_in_chunks():
    r = broker.client()
    for i in range(25):
        publish(r, sample(host="h", gpu_index=i))
    assert [s.gpu_index for s in cluster_samples(r, scan_count=7)] == list(range(25))


def test_publisher_publishes_at_most_once_per_interval():
    r = broker.client()
    now = [1000.0]
    publisher = Publisher(r, min_interval_s=1.0, clock=lambda: now[0])
    assert publisher.maybe_publish(sample(gpu_util=0.1))
    assert not publisher.maybe_publish(sample(gpu_util=0.2))
    now[0] += 0.5
    assert not publisher.maybe_publish(sample(gpu_util=0.3))
    assert cluster_samples(r)[0].gpu_util == 0.1
    now[0] += 0.6
    assert publisher.maybe_publish(sample(gpu_util=0.4))
    assert cluster_samples(r)[0].gpu_util == 0.4
    assert not publisher.maybe_publish(None)


def test_publisher_swallows_redis_errors_and_warns_once(telemetry_log):
    # No retries: redis-py 8 otherwise backs off for about 3 s before giving up on a refused connection.
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    now = [0.0]
    publisher = Publisher(dead, min_interval_s=1.0, error_backoff_s=10.0, clock=lambda: now[0])
    assert not publisher.maybe_publish(sample())
    now[0] += 5.0
    assert not publisher.maybe_publish(sample())  # backing off: Redis is not even tried
    now[0] += 6.0
    assert not publisher.maybe_publish(sample())  # tried again, failed again, not logged again
    assert len(telemetry_log.warnings) == 1 and "could not publish GPU telemetry" in telemetry_log.warnings[0]


# --- the API view ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_gpus_api_lists_the_cluster(alice):
    from webapp.gpus_api import gpus

    publish(broker.client(), sample(host="a", gpu_index=1, gpu_util=0.25))
    publish(broker.client(), sample(host="a", gpu_index=0, gpu_util=0.75))
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
