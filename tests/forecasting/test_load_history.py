"""The load history: a sample from jobs in the database and heartbeats and GPU telemetry in a
real Redis; retention; the beat task and its seeding."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
import redis
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from redis.backoff import NoBackoff
from redis.retry import Retry

from clockq.bus import heartbeat
from clockq.bus.client import client as broker
from clockq.bus.gpu_samples import GpuSample, publish
from clockq.forecasting import load_history
from clockq.forecasting.models import MetricSample
from clockq.jobs.models import Job
from clockq.jobs.periodic import LOAD_SAMPLE, ensure_periodic_tasks
from tests.harness import ROOT, free_port
from tests.helpers import submit

NOW = datetime(2026, 12, 1, 12, 0, 30, 250_000, tzinfo=UTC)


def alive(name: str, gpu: int | None, host: str) -> None:
    heartbeat.announce(broker(), {"hostname": name, "gpu": gpu, "host": host, "pid": 1, "started": 0.0})


def cluster(alice) -> None:
    """3 GPU workers (2 on hostA, 1 on hostB) and the control worker; 2 jobs running on hostA;
    3 SP and 1 HP queued; 1 held for admission, 1 held by an operator, 1 finished."""
    alive("gpu0@hostA", 0, "hostA")
    alive("gpu1@hostA", 1, "hostA")
    alive("gpu0@hostB", 0, "hostB")
    alive("control@hostA", None, "hostA")
    r = broker()
    publish(r, GpuSample("hostA", 0, 1000.0, True, gpu_util=0.9, host_cpu=0.2, host_mem=0.5))
    publish(r, GpuSample("hostA", 1, 1001.0, True, gpu_util=0.5, host_cpu=0.4, host_mem=0.6))
    publish(r, GpuSample("hostB", 0, 1000.0, False, gpu_util=0.1, host_cpu=0.8, host_mem=0.2))
    for name, worker in (("r1", "gpu0@hostA"), ("r2", "gpu1@hostA")):
        Job.objects.filter(pk=submit(alice, "BP", name).pk).update(state="running", worker=worker)
    for i in range(3):
        submit(alice, "SP", f"sp{i}")
    submit(alice, "HP", "hp")
    Job.objects.filter(pk=submit(alice, "BK", "admission").pk).update(state="held", held_for_admission=True)
    Job.objects.filter(pk=submit(alice, "BK", "by hand").pk).update(state="held")
    Job.objects.filter(pk=submit(alice, "BK", "done").pk).update(state="succeeded")


@pytest.mark.django_db
def test_a_sample_holds_the_clusters_load(alice):
    cluster(alice)

    sample = load_history.record_sample(NOW)

    sample.refresh_from_db()
    assert sample.at == NOW.replace(microsecond=0)
    # capacity: the three GPU workers alive (not the control worker); demand: 2 running + 4 queued
    assert (sample.gpus, sample.running_gpus, sample.waiting_gpus, sample.held) == (3, 2, 4, 1)
    assert sample.load_index == pytest.approx(2.0)  # 6 / 3, the cap
    assert sample.queue_depth == {"BK": 0, "BP": 0, "HP": 1, "RT": 0, "SP": 3}
    # GPU utilisation over GPUs, CPU and memory over hosts (hostA's newest reading)
    assert sample.gpu_util == pytest.approx((0.9 + 0.5 + 0.1) / 3)
    assert sample.cpu == pytest.approx((0.4 + 0.8) / 2)
    assert sample.memory == pytest.approx((0.6 + 0.2) / 2)
    assert sample.hosts == {
        "hostA": {"gpus": 2, "gpu_util": pytest.approx(0.7), "cpu": 0.4, "memory": 0.6, "busy": 2},
        "hostB": {"gpus": 1, "gpu_util": 0.1, "cpu": 0.8, "memory": 0.2, "busy": 0},
    }


@pytest.mark.django_db
def test_the_index_follows_the_queue_below_the_cap(alice):
    for i in range(4):
        alive(f"gpu{i}@h", i, "h")
    Job.objects.filter(pk=submit(alice, "SP", "run").pk).update(state="running", worker="gpu0@h")
    submit(alice, "SP", "wait")

    sample = load_history.record_sample(NOW)

    assert (sample.running_gpus, sample.waiting_gpus, sample.gpus, sample.load_index) == (1, 1, 4, 0.5)
    assert sample.gpu_util is None and sample.cpu is None  # no telemetry: unknown, not 0
    assert sample.hosts == {"h": {"gpus": 4, "gpu_util": None, "cpu": None, "memory": None, "busy": 1}}


@pytest.mark.django_db
def test_no_gpu_worker_alive_gives_no_index(alice):
    submit(alice, "SP", "wait")

    sample = load_history.record_sample(NOW)

    assert (sample.gpus, sample.waiting_gpus, sample.load_index) == (0, 1, None)


@pytest.mark.django_db
def test_a_second_sample_in_the_same_second_replaces_the_first(alice):
    alive("gpu0@h", 0, "h")
    load_history.record_sample(NOW)
    submit(alice, "SP", "wait")

    load_history.record_sample(NOW + timedelta(milliseconds=500))

    assert list(MetricSample.objects.values_list("waiting_gpus", "load_index")) == [(1, 1.0)]


@pytest.mark.django_db
def test_without_the_broker_no_sample_is_recorded(monkeypatch):
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    monkeypatch.setattr("clockq.bus.heartbeat.client", lambda: dead)
    monkeypatch.setattr("clockq.forecasting.load_history.client", lambda: dead)

    with pytest.raises(redis.RedisError):
        load_history.record_sample(NOW)
    from control.tasks import load_sample

    assert load_sample.apply().get() is None  # the beat task logs it and goes on
    assert not MetricSample.objects.exists()


@pytest.mark.django_db
def test_prune_keeps_the_last_days(settings):
    for days in (0, 1, 34, 35, 36, 90):
        MetricSample.objects.create(at=NOW - timedelta(days=days, seconds=1))

    assert load_history.prune(keep_days=35, now=NOW) == 3  # 35 d + 1 s, 36 d, 90 d
    assert MetricSample.objects.count() == 3
    settings.CLOCKQ_LOAD_HISTORY_DAYS = 1
    assert load_history.prune(now=NOW) == 2
    assert list(MetricSample.objects.values_list("at", flat=True)) == [NOW - timedelta(seconds=1)]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            load_history.prune(keep_days=bad)


@pytest.mark.django_db
def test_the_beat_task_samples_prunes_and_skips_a_doubled_tick(alice, settings):
    settings.CLOCKQ_LOAD_HISTORY_DAYS = 35
    MetricSample.objects.create(at=NOW - timedelta(days=40))
    alive("gpu0@h", 0, "h")

    first = load_history.sample_load(NOW)
    again = load_history.sample_load(NOW + timedelta(seconds=2))  # a re-delivered tick
    later = load_history.sample_load(NOW + timedelta(seconds=60))

    assert first is not None and again is None and later is not None
    assert MetricSample.objects.count() == 2  # the 40-day-old one is gone
    from control.tasks import load_sample

    assert load_sample.apply().get() == 0.0  # one GPU, nothing running or waiting


@pytest.mark.django_db
def test_the_periodic_task_is_seeded_with_the_setting(settings):
    # the migration seeded it with the default
    task = PeriodicTask.objects.get(name=LOAD_SAMPLE)
    assert (task.task, task.interval.every, task.interval.period, task.queue) == (
        "clockq.load_sample",
        60,
        "seconds",
        "control",
    )
    assert task.expire_seconds == 60
    # a fresh database, with the interval set to 15 s
    task.delete()
    settings.CLOCKQ_LOAD_SAMPLE_EVERY_S = 15
    ensure_periodic_tasks(PeriodicTask, IntervalSchedule)
    assert PeriodicTask.objects.get(name=LOAD_SAMPLE).interval.every == 15
    # an operator's edit is kept
    settings.CLOCKQ_LOAD_SAMPLE_EVERY_S = 30
    ensure_periodic_tasks(PeriodicTask, IntervalSchedule)
    assert PeriodicTask.objects.get(name=LOAD_SAMPLE).interval.every == 15


def _settings_with(**env: str) -> subprocess.CompletedProcess:
    code = "import clockq.settings as s; print(s.CLOCKQ_LOAD_SAMPLE_EVERY_S, s.CLOCKQ_LOAD_HISTORY_DAYS)"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_settings_take_their_range():
    assert _settings_with().stdout.split() == ["60", "35"]
    done = _settings_with(CLOCKQ_LOAD_SAMPLE_EVERY_S="15", CLOCKQ_LOAD_HISTORY_DAYS="3650")
    assert done.stdout.split() == ["15", "3650"], done.stderr[-500:]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("CLOCKQ_LOAD_SAMPLE_EVERY_S", "14", "CLOCKQ_LOAD_SAMPLE_EVERY_S=14 is below the minimum 15"),
        ("CLOCKQ_LOAD_SAMPLE_EVERY_S", "3601", "above the maximum 3600"),
        ("CLOCKQ_LOAD_SAMPLE_EVERY_S", "1m", "is not an integer"),
        ("CLOCKQ_LOAD_HISTORY_DAYS", "0", "CLOCKQ_LOAD_HISTORY_DAYS=0 is below the minimum 1"),
    ],
)
def test_a_bad_setting_stops_startup(name, value, message):
    done = _settings_with(**{name: value})
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and message in done.stderr
