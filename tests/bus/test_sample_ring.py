"""The bounded sample ring in a real Redis: one sample per slot whoever writes it, trimmed by
age and by count, and a read that leaves out what another host's code wrote wrongly."""

from __future__ import annotations

import json
import logging
import math

import pytest
import redis

from clockq.bus.client import client as broker
from clockq.bus.sample_ring import SampleRing

RING = SampleRing("clockq:samples:test", step_s=5, keep_s=60, max_samples=100)


def test_a_slot_holds_one_sample_whoever_writes_it(redis_server):
    # Given two hosts, each with its own connection to the shared Redis
    host_a, host_b = broker(), redis.Redis.from_url(redis_server.url)

    # When both write the same 5 s slot (a doubled beat tick), and then the next slot
    assert RING.write(host_a, 1_000.0, {"n": 1}) == 1_000
    assert RING.write(host_b, 1_004.9, {"n": 2}) == 1_000
    RING.write(host_a, 1_005.0, {"n": 3})

    # Then each slot holds one sample, the last written
    assert RING.read(host_b, 0, 2_000) == [{"t": 1_000, "n": 2}, {"t": 1_005, "n": 3}]
    assert RING.read(host_a, 1_001, 1_005) == [{"t": 1_005, "n": 3}]  # a window of slots, ends included


def test_the_ring_drops_samples_older_than_it_keeps():
    r = broker()
    for ts in range(0, 200, 5):
        RING.write(r, ts, {"n": ts})
    kept = RING.read(r, 0, 1_000)
    assert [s["t"] for s in kept] == list(range(135, 200, 5))  # 60 s back from the newest write
    assert r.zcard(RING.key) == len(kept)


def test_the_ring_keeps_at_most_its_count_however_short_the_writes():
    r = broker()
    ring = SampleRing("clockq:samples:test-count", step_s=1, keep_s=3_600, max_samples=10)
    for ts in range(25):
        ring.write(r, ts, {"n": ts})
    assert [s["n"] for s in ring.read(r, 0, 100)] == list(range(15, 25))


def test_a_read_leaves_out_what_is_not_a_sample_and_says_so(log_records):
    r = broker()
    RING.write(r, 10, {"n": 1})
    r.zadd(RING.key, {"not json": 15, json.dumps([1, 2]): 20, json.dumps({"t": 99, "n": 4}): 25})
    logger = logging.getLogger("clockq.samples")
    logger.addHandler(log_records)
    try:
        found = RING.read(r, 0, 100)
    finally:
        logger.removeHandler(log_records)
    # The score is the slot: a member that names another slot does not move there.
    assert found == [{"t": 10, "n": 1}, {"t": 25, "n": 4}]
    assert log_records.warnings == [f"{RING.key}: skipped 2 sample(s) that are not JSON objects"]


def test_bad_arguments_are_refused_before_anything_is_written():
    r = broker()
    for bad in (0, -5, 1.5, True):
        with pytest.raises(ValueError):
            SampleRing("k", step_s=bad, keep_s=60, max_samples=10)
    with pytest.raises(ValueError, match="'t'"):
        RING.write(r, 10, {"t": 3})
    with pytest.raises(ValueError):
        RING.write(r, math.nan, {"n": 1})
    assert not r.exists(RING.key)
