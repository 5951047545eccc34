"""The queue samples every 5 s: what one counts (jobs in the database, GPU workers' heartbeats in
a real Redis), the ring it is kept in, the beat task, and the real beat and control worker
writing them while a burst comes and goes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import redis
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from redis.backoff import NoBackoff
from redis.retry import Retry

from clockq.bus import heartbeat
from clockq.bus.client import client as broker
from clockq.jobs import queue_samples
from clockq.jobs.models import Job, QueueTier
from clockq.jobs.periodic import QUEUE_SAMPLE, ensure_periodic_tasks
from tests.harness import Beat, free_port, wait_for
from tests.helpers import database_url, submit

NOW = datetime(2026, 12, 1, 12, 0, 33, 250_000, tzinfo=UTC)


def alive(name: str, gpu: int | None) -> None:
    heartbeat.announce(broker(), {"hostname": name, "gpu": gpu, "host": "hostA", "pid": 1, "started": 0.0})


def submitted(job: Job, at: datetime, **fields) -> Job:
    Job.objects.filter(pk=job.pk).update(submitted_at=at, **fields)
    return job


@pytest.mark.django_db
def test_a_sample_counts_the_jobs_waiting_per_own_tier_and_the_longest_wait(alice):
    # Given two GPU workers and the control worker alive; in SP, a job waiting 40 s, one 10 s,
    # and one that ran before and waits again (it counts, but its first wait is over); in BP a
    # job promoted to SP for its batch chance, waiting 100 s; one job running, one held
    alive("gpu0@hostA", 0), alive("gpu1@hostA", 1), alive("control@hostA", None)
    submitted(submit(alice, "SP", "a"), NOW - timedelta(seconds=40))
    submitted(submit(alice, "SP", "b"), NOW - timedelta(seconds=10))
    submitted(submit(alice, "SP", "again"), NOW - timedelta(hours=1), first_started_at=NOW - timedelta(minutes=59))
    nightly = submitted(submit(alice, "BP", "nightly"), NOW - timedelta(seconds=100))
    Job.objects.filter(pk=nightly.pk).update(tier=QueueTier.objects.get(code="SP"))
    Job.objects.filter(pk=submit(alice, "HP", "running").pk).update(state="running", worker="gpu0@hostA")
    Job.objects.filter(pk=submit(alice, "BK", "held").pk).update(state="held", held_for_admission=True)

    # When it is sampled
    sample = queue_samples.record_queue_sample(NOW)

    # Then: the slot's start, counts per own tier (as the KPI rollup counts them), the longest
    # first wait per own tier, and the load index over the two GPU workers
    assert sample.at == datetime(2026, 12, 1, 12, 0, 30, tzinfo=UTC)
    assert sample.queued == {"RT": 0, "HP": 0, "SP": 3, "BP": 1, "BK": 0}
    assert sample.oldest_wait_s == {"RT": 0.0, "HP": 0.0, "SP": 40.0, "BP": 100.0, "BK": 0.0}
    assert (sample.running, sample.gpus, sample.load_index) == (1, 2, 2.0)  # (1 + 4) / 2, capped at 2
    # And the ring gives it back as it was taken
    assert queue_samples.queue_series(NOW - timedelta(minutes=1), NOW) == [sample]


@pytest.mark.django_db
def test_without_a_gpu_worker_there_is_no_load_index_and_without_the_broker_no_sample(monkeypatch):
    assert queue_samples.record_queue_sample(NOW).load_index is None

    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    monkeypatch.setattr("clockq.bus.heartbeat.client", lambda: dead)
    monkeypatch.setattr("clockq.jobs.queue_samples.client", lambda: dead)
    with pytest.raises(redis.RedisError):
        queue_samples.record_queue_sample(NOW + timedelta(seconds=5))
    from control.tasks import queue_sample

    assert queue_sample.apply().get() is None  # the beat task logs it and goes on
    monkeypatch.undo()
    assert len(queue_samples.queue_series(NOW - timedelta(minutes=1), NOW + timedelta(minutes=1))) == 1


@pytest.mark.django_db
def test_a_sample_another_host_wrote_wrongly_is_left_out():
    queue_samples.RING.write(broker(), NOW.timestamp(), {"queued": {"SP": -1}})
    queue_samples.RING.write(broker(), NOW.timestamp() - 5, {"queued": "many"})
    queue_samples.record_queue_sample(NOW - timedelta(seconds=10))
    series = queue_samples.queue_series(NOW - timedelta(minutes=1), NOW)
    assert [s.at for s in series] == [datetime(2026, 12, 1, 12, 0, 20, tzinfo=UTC)]


@pytest.mark.django_db
def test_the_beat_task_is_seeded_every_5_s_on_the_control_queue():
    task = PeriodicTask.objects.get(name=QUEUE_SAMPLE)  # the migrations seeded it
    assert (task.task, task.interval.every, task.interval.period, task.queue, task.expire_seconds) == (
        "clockq.queue_sample",
        queue_samples.STEP_S,
        "seconds",
        "control",
        queue_samples.STEP_S,
    )
    from clockq.celery import app

    assert "clockq.queue_sample" in app.tasks


@pytest.mark.integration
def test_the_real_beat_and_control_worker_sample_a_burst_as_it_comes_and_goes(
    transactional_db, redis_server, tmp_path, alice
):
    # Given beat and the control worker, with the seeded periodic tasks (a transactional test's
    # flush removes the rows the migrations made), and 11 jobs submitted at once in each of SP,
    # BP and BK (the control worker's SLO check would time RT and HP jobs out before their start,
    # with no GPU worker here to start them)
    ensure_periodic_tasks(PeriodicTask, IntervalSchedule)
    beat = Beat({"DATABASE_URL": database_url()}, tmp_path).start(redis_server.url)
    tiers = ("SP", "BP", "BK")
    try:
        burst = [submit(alice, code, f"burst-{code}-{i}") for code in tiers for i in range(11)]
        start = timezone.now()

        def sampled(depth: int) -> list[queue_samples.QueueSample]:
            for service in beat.services:
                service.check_alive()
            found = queue_samples.queue_series(start, timezone.now())
            return [s for s in found if {s.queued[code] for code in tiers} == {depth}]

        # When beat's task samples the queues: each of those tiers shows the burst
        [peak, *_] = wait_for(lambda: sampled(11), 60, what="a sample of the burst")
        assert min(peak.oldest_wait_s[code] for code in tiers) > 0

        # And when the burst is over (its jobs cancelled), a later sample shows it gone (in the
        # same 5 s slot, it replaces the peak: one sample per slot, the last)
        Job.objects.filter(pk__in=[j.pk for j in burst]).update(state="cancelled")
        [after, *_] = wait_for(lambda: sampled(0), 60, what="a sample after the burst")
        assert after.at >= peak.at
    finally:
        beat.stop()
        print(f"--- beat and control worker (tail) ---\n{beat.log_text()[-5000:]}")
