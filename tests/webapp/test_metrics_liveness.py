"""The families of /metrics that Prometheus's alerts need: each tier's wait target, job ends and
whether they were on time, the live workers, the beat, and the checkpoint disk's room."""

from __future__ import annotations

import math
import os
import shutil
from datetime import timedelta

import pytest
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from clockq.bus import counters, heartbeat
from clockq.bus.client import client as broker
from clockq.jobs.models import Job, QueueTier
from clockq.jobs.promotion import promote_job
from clockq.jobs.services import cancel_job
from clockq.jobs.transitions import transition
from clockq.policy.states import JobState
from clockq.stack.roles import beat_argv
from tests.harness import ROOT, Service, wait_for
from tests.helpers import database_url, submit
from tests.webapp.test_metrics import BEARER, TOKEN, scrape


@pytest.fixture(autouse=True)
def _token_and_awake_counters(settings, monkeypatch):
    settings.CLOCKQ_METRICS_TOKEN = TOKEN
    monkeypatch.setattr(counters, "_quiet_until", -math.inf)


@pytest.mark.django_db
def test_each_tier_shows_its_wait_target_and_a_best_effort_tier_none(client):
    m = scrape(client)
    assert m.labelled("clockq_tier_wait_target_seconds") == {
        (("tier", "RT"),): 0.05,
        (("tier", "HP"),): 60,
        (("tier", "SP"),): 600,
        (("tier", "BP"),): 4 * 3600,
    }

    # An operator's edit of the tier shows at the next scrape
    QueueTier.objects.filter(code="HP").update(wait_target_ms=30_000)
    QueueTier.objects.filter(code="BP").update(wait_target_ms=None)
    m = scrape(client)
    assert m.value("clockq_tier_wait_target_seconds", tier="HP") == 30
    assert ("tier", "BP") not in {k[0] for k in m.labelled("clockq_tier_wait_target_seconds")}


@pytest.mark.django_db
def test_the_oldest_wait_is_the_longest_waiting_never_started_job_of_each_own_tier(client, alice):
    now = timezone.now()
    for name, tier, ago_s, started in (("a", "SP", 700, False), ("b", "SP", 30, False), ("c", "SP", 900, True)):
        job = submit(alice, tier, name)
        Job.objects.filter(pk=job.pk).update(
            submitted_at=now - timedelta(seconds=ago_s), first_started_at=now if started else None
        )
    lifted = submit(alice, "SP", "lifted")  # promoted to HP: its SLO is still SP's
    Job.objects.filter(pk=lifted.pk).update(submitted_at=now - timedelta(seconds=800))
    promote_job(lifted, actor="carol")

    m = scrape(client)

    assert 800 <= m.value("clockq_queue_oldest_wait_seconds", tier="SP") < 860  # c has started once
    assert m.value("clockq_queue_oldest_wait_seconds", tier="HP") == 0
    assert m.value("clockq_queue_oldest_wait_seconds", tier="RT") == 0


def _finish(job: Job, state: JobState, *, first_wait_ms: int | None, **updates) -> None:
    """End a running job as a worker does: one transition that sets its end columns."""
    Job.objects.filter(pk=job.pk).update(state="running", worker="gpu0@h", first_wait_ms=first_wait_ms)
    token = Job.objects.get(pk=job.pk).dispatch_token
    done = transition(
        job.pk,
        to=state,
        expect={JobState.RUNNING},
        token=token,
        reason="test",
        actor="gpu0@h",
        updates={"finished_at": timezone.now(), **updates},
    )
    assert done is not None


@pytest.mark.django_db
def test_job_ends_are_counted_in_the_own_tier_and_judged_on_time_as_the_kpis_judge(
    client, alice, carol, django_capture_on_commit_callbacks
):
    # Given, ending: an SP job within its 10 min target, one past it, one that failed, an SP job
    # promoted to HP (counted in SP), one past its own deadline, and a cancelled BK job
    with django_capture_on_commit_callbacks(execute=True):
        _finish(submit(alice, "SP", "quick"), JobState.SUCCEEDED, first_wait_ms=1_000)
        _finish(submit(alice, "SP", "slow"), JobState.SUCCEEDED, first_wait_ms=700_000)
        _finish(submit(alice, "SP", "broken"), JobState.FAILED, first_wait_ms=1_000)
        lifted = submit(alice, "SP", "lifted")
        promote_job(lifted, actor="carol")
        _finish(lifted, JobState.SUCCEEDED, first_wait_ms=2_000)
        overdue = submit(alice, "HP", "overdue")
        Job.objects.filter(pk=overdue.pk).update(deadline=timezone.now() - timedelta(minutes=1))
        _finish(overdue, JobState.SUCCEEDED, first_wait_ms=10)
        cancel_job(submit(alice, "BK", "dropped"), actor="alice")

    # When Prometheus scrapes
    m = scrape(client)

    # Then
    def ended(tier: str, state: str, on_time: str) -> float:
        return m.value("clockq_jobs_ended_total", tier=tier, state=state, on_time=on_time)

    assert (ended("SP", "succeeded", "true"), ended("SP", "succeeded", "false")) == (2, 1)
    assert (ended("SP", "failed", "false"), ended("HP", "succeeded", "false")) == (1, 1)
    assert ended("HP", "succeeded", "true") == 0  # promoted jobs count in their own tier
    assert ended("BK", "cancelled", "false") == 1
    assert ended("RT", "timed_out", "false") == 0  # shown before the first
    assert sum(m.labelled("clockq_jobs_ended_total").values()) == 6


@pytest.mark.django_db
def test_each_live_worker_has_a_series_until_its_heartbeat_expires(client):
    r = broker()
    for name, gpu in (("gpu0@hostA", 0), ("gpu1@hostA", 1), ("gpu0@hostB", 0), ("control@hostC", None)):
        heartbeat.announce(r, {"hostname": name, "gpu": gpu})
    heartbeat.announce(r, {"hostname": "predictor@hostC", "gpu": None})

    m = scrape(client)
    assert m.labelled("clockq_worker_up") == {
        (("gpu", "0"), ("host", "hostA"), ("role", "gpu"), ("worker", "gpu0@hostA")): 1,
        (("gpu", "1"), ("host", "hostA"), ("role", "gpu"), ("worker", "gpu1@hostA")): 1,
        (("gpu", "0"), ("host", "hostB"), ("role", "gpu"), ("worker", "gpu0@hostB")): 1,
        (("gpu", ""), ("host", "hostC"), ("role", "control"), ("worker", "control@hostC")): 1,
        (("gpu", ""), ("host", "hostC"), ("role", "predictor"), ("worker", "predictor@hostC")): 1,
    }

    # When gpu1@hostA's heartbeat expires (as its 15 s TTL would)
    r.delete(heartbeat.KEY_PREFIX + "gpu1@hostA")
    m = scrape(client)
    assert ("worker", "gpu1@hostA") not in {dict(k).get("worker") for k in m.labelled("clockq_worker_up")}
    assert len(m.labelled("clockq_worker_up")) == 4


@pytest.mark.django_db
def test_the_beats_last_run_is_the_newest_enabled_periodic_task_sent(client):
    assert scrape(client).families["clockq_beat_last_run_timestamp_seconds"].samples == []
    every = IntervalSchedule.objects.create(every=10, period=IntervalSchedule.SECONDS)
    now = timezone.now()
    for name, ago_s, enabled in (("old", 300, True), ("new", 20, True), ("off", 1, False)):
        PeriodicTask.objects.create(
            name=name, task="t", interval=every, enabled=enabled, last_run_at=now - timedelta(seconds=ago_s)
        )

    m = scrape(client)

    assert m.value("clockq_beat_last_run_timestamp_seconds") == pytest.approx((now - timedelta(seconds=20)).timestamp())


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_running_beat_moves_its_last_run_forward(client, redis_server, tmp_path):
    # Given a real celery beat on the test database (its scheduler writes back at its first send)
    started = timezone.now().timestamp()
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": redis_server.url}
    argv = [*beat_argv(), "--max-interval", "1", "--schedule", str(tmp_path / "beat-schedule")]
    beat = Service("beat", [*argv, "--pidfile", str(tmp_path / "beat.pid")], env, ROOT, tmp_path / "beat.log").start()
    try:
        # When it has sent its first tasks, Then /metrics says so
        def last_run() -> float | None:
            beat.check_alive()
            samples = scrape(client).families["clockq_beat_last_run_timestamp_seconds"].samples
            return samples[0].value if samples and samples[0].value >= started - 1 else None

        assert wait_for(last_run, 60, interval=0.2, what="beat's first write-back") <= timezone.now().timestamp()
    finally:
        beat.stop()
        print(beat.tail(60))  # shown when the test fails


@pytest.mark.django_db
def test_the_checkpoint_disks_size_and_room_are_the_filesystems(client, settings, tiny_filesystem):
    settings.CLOCKQ_CHECKPOINT_DIR = tiny_filesystem
    m = scrape(client)
    assert m.value("clockq_checkpoint_disk_size_bytes") == 2 * 2**20
    before = m.value("clockq_checkpoint_disk_free_bytes")
    assert before == shutil.disk_usage(tiny_filesystem).free

    (tiny_filesystem / "checkpoint").write_bytes(b"\0" * 2**20)

    assert scrape(client).value("clockq_checkpoint_disk_free_bytes") == before - 2**20


@pytest.mark.django_db
def test_a_checkpoint_folder_not_readable_from_the_web_host_leaves_the_disk_out(client, settings, tmp_path):
    settings.CLOCKQ_CHECKPOINT_DIR = tmp_path / "not-mounted-here"
    m = scrape(client, **BEARER)
    assert m.families["clockq_checkpoint_disk_size_bytes"].samples == []
    assert m.families["clockq_checkpoint_disk_free_bytes"].samples == []
