"""GPU samples as data and through a real Redis: validation, publishing, the cluster view."""

from __future__ import annotations

import json

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from clockq.bus import gpu_samples
from clockq.bus.client import client
from clockq.bus.gpu_samples import GpuSample, Publisher, cluster_samples, publish


def sample(**overrides) -> GpuSample:
    base = dict(host="h1", gpu_index=0, ts=1700000000.5, simulated=True, gpu_util=0.5, mem_util=0.3, error=None)
    return GpuSample(**{**base, **overrides})


def test_sample_round_trips_through_a_dict_and_ignores_unknown_keys():
    s = sample(host="h2", gpu_index=2, mem_used_mib=100, power_w=61.5)
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
    r = client()
    b1, a0, a1 = sample(host="b", gpu_index=1), sample(host="a", gpu_index=0), sample(host="a", gpu_index=1)
    for s in (b1, a1, a0):
        publish(r, s)
    r.set("clockq:gpu:evil:0", b"not json", ex=15)
    r.set("clockq:gpu:evil:1", json.dumps({"host": "evil", "gpu_index": "x"}), ex=15)
    r.set("clockq:gpu:evil:2", b"\xff\xfe", ex=15)
    r.set("clockq:other", "untouched")
    assert cluster_samples(r) == [a0, a1, b1]
    ttl = r.ttl("clockq:gpu:a:0")
    assert 0 < ttl <= gpu_samples.TTL_S
    assert json.loads(r.get("clockq:gpu:b:1")) == b1.to_dict()


def test_many_gpus_are_read_in_chunks():
    r = client()
    for i in range(25):
        publish(r, sample(host="h", gpu_index=i))
    assert [s.gpu_index for s in cluster_samples(r, scan_count=7)] == list(range(25))


def test_publisher_publishes_at_most_once_per_interval():
    r = client()
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
