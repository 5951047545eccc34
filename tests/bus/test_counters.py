"""The event counters /metrics reads: written after commit, best effort, read back through a real Redis."""

from __future__ import annotations

import logging
import math

import pytest
import redis
from django.db import transaction
from redis.backoff import NoBackoff
from redis.retry import Retry

from clockq.bus import counters
from clockq.bus.client import client
from clockq.policy.kpis import WAIT_BUCKETS_MS
from tests.harness import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _counters_awake(monkeypatch):
    """No pause left over from a broker error in an earlier test of this process."""
    monkeypatch.setattr(counters, "_quiet_until", -math.inf)


@pytest.fixture
def committed(django_capture_on_commit_callbacks):
    """The test's transaction commits at the end of the block (pytest-django's `db` never
    commits, so on_commit writes would never happen)."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


def test_slices_are_counted_by_tier_and_outcome_with_their_gpu_time(committed):
    with committed():
        counters.count_slice(tier="SP", outcome="continued", used_ms=50)
        counters.count_slice(tier="SP", outcome="continued", used_ms=48)
        counters.count_slice(tier="HP", outcome="completed", used_ms=12)

    found = counters.read_counters()

    assert found.slices == {("SP", "continued"): 2, ("HP", "completed"): 1}
    assert found.slice_ms == {("SP", "continued"): 98.0, ("HP", "completed"): 12.0}
    assert found.switch == {}  # none of them made way for another job


def test_a_yielded_slice_adds_its_switch_cost_to_the_histogram(committed):
    with committed():
        counters.count_slice(tier="SP", outcome="yielded", used_ms=50, switch_ms=3.5)  # bucket <= 5
        counters.count_slice(tier="SP", outcome="yielded", used_ms=50, switch_ms=5.0)  # a bound is inclusive
        counters.count_slice(tier="SP", outcome="yielded", used_ms=50, switch_ms=99_999)  # beyond the last bound

    switch = counters.read_counters().switch["SP"]

    five = counters.SWITCH_BUCKETS_MS.index(5)
    assert switch.count == 3
    assert switch.sum == pytest.approx(100_007.5)
    assert switch.buckets[five] == 2 and switch.buckets[-1] == 1 and sum(switch.buckets) == 3
    assert switch.cumulative()[five - 1] == 0 and switch.cumulative()[five] == 2 and switch.cumulative()[-1] == 3


def test_first_waits_fall_in_the_kpi_wait_buckets(committed):
    with committed():
        counters.count_first_start(tier="RT", wait_ms=50)
        counters.count_first_start(tier="RT", wait_ms=51)
        counters.count_first_start(tier="BK", wait_ms=10**9)

    wait = counters.read_counters().wait

    assert len(wait["RT"].buckets) == len(WAIT_BUCKETS_MS) + 1
    assert wait["RT"].buckets[:2] == [1, 1] and wait["RT"].count == 2 and wait["RT"].sum == 101
    assert wait["BK"].buckets[-1] == 1


def test_promotions_are_counted_by_route_and_kind_never_by_name(committed):
    with committed():
        counters.count_promotion(from_tier="SP", to_tier="HP", actor="promotion tick")
        counters.count_promotion(from_tier="BP", to_tier="SP", actor="batch chance")
        counters.count_promotion(from_tier="BK", to_tier="BP", actor="carol")
        counters.count_promotion(from_tier="BK", to_tier="BP", actor="dave")

    assert counters.read_counters().promotions == {
        ("SP", "HP", "starved"): 1,
        ("BP", "SP", "batch_chance"): 1,
        ("BK", "BP", "by_hand"): 2,
    }


@pytest.mark.django_db(transaction=True)
def test_only_a_committed_slice_is_counted():
    # Given a slice recorded in a transaction that rolls back
    with pytest.raises(RuntimeError), transaction.atomic():
        counters.count_slice(tier="SP", outcome="completed", used_ms=10)
        assert counters.read_counters().slices == {}  # nothing before the commit either
        raise RuntimeError("the slice's transaction fails")
    # When another one commits
    with transaction.atomic():
        counters.count_slice(tier="SP", outcome="failed", used_ms=10)
    # Then only that one counts
    assert counters.read_counters().slices == {("SP", "failed"): 1}


def test_a_dead_broker_costs_one_attempt_and_never_raises(committed, monkeypatch, log_records):
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    attempts = []
    monkeypatch.setattr(counters, "client", lambda: attempts.append(1) or dead)
    logger = logging.getLogger("clockq.counters")
    logger.addHandler(log_records)
    monkeypatch.setattr(logger, "level", logging.DEBUG)
    try:
        with committed():  # raises if a write does
            counters.count_slice(tier="SP", outcome="completed", used_ms=10)
            counters.count_first_start(tier="SP", wait_ms=10)
            counters.count_promotion(from_tier="SP", to_tier="HP", actor="promotion tick")
    finally:
        logger.removeHandler(log_records)

    assert len(attempts) == 1  # the later events are dropped while the counters pause
    assert [r.levelno for r in log_records.records] == [logging.DEBUG]
    assert "pausing counters" in log_records.records[0].getMessage()


def test_fields_that_do_not_parse_are_skipped():
    r = client()
    r.hset(counters.SLICES_KEY, mapping={"SP:completed": "3", "SP:yielded": "lots", "junk": "1", "a:b:c:d": "1"})
    r.hset(counters.WAIT_KEY, mapping={"SP:count": "1", "SP:b999": "1", "SP:sum": "nan", "SP:b0": "1", ":count": "4"})
    r.hset(counters.PROMOTIONS_KEY, mapping={"SP:HP": "1", "SP:HP:starved": "x"})

    found = counters.read_counters()

    assert found.slices == {("SP", "completed"): 3}
    assert found.wait["SP"].count == 1 and found.wait["SP"].buckets[0] == 1 and found.wait["SP"].sum == 0.0
    assert set(found.wait) == {"SP"}
    assert found.promotions == {}
