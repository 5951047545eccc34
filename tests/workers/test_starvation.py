"""Starvation control and service levels end to end: real beat (DatabaseScheduler), the real
control worker running its tasks, and real GPU workers. Intervals are shortened by editing the
periodic tasks, as an operator would in the admin, while beat runs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from clockq.jobs.checkpoints import CheckpointStore
from clockq.jobs.models import Job, QueueTier
from tests.harness import Beat, wait_for
from tests.helpers import database_url, submit, wait_finished

pytestmark = pytest.mark.integration


@pytest.fixture
def beat(transactional_db, redis_server, settings, tmp_path):
    """Beat and the control worker, with the seeded periodic tasks (a transactional test's
    flush removes the rows the migration made)."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from clockq.jobs.periodic import ensure_periodic_tasks

    ensure_periodic_tasks(PeriodicTask, IntervalSchedule)
    started: list[Beat] = []

    def start(**every_s: int) -> Beat:
        for name, seconds in every_s.items():
            set_interval(name.replace("_", " "), seconds)
        env = {"DATABASE_URL": database_url(), "CLOCKQ_CHECKPOINT_DIR": str(settings.CLOCKQ_CHECKPOINT_DIR)}
        started.append(Beat(env, tmp_path, loglevel="DEBUG").start(redis_server.url))
        return started[-1]

    yield start
    for b in started:
        b.stop()
        print(f"--- beat and control worker (tail) ---\n{b.log_text()[-5000:]}")


def set_interval(task: str, seconds: int) -> None:
    """What an operator does in the admin: give the periodic task another interval."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    periodic = PeriodicTask.objects.get(name=f"clockq: {task}")
    periodic.interval, _ = IntervalSchedule.objects.get_or_create(every=seconds, period="seconds")
    periodic.expire_seconds = seconds
    periodic.save()  # signals beat's DatabaseScheduler that the table changed


BEAT_TICK = "beat: Waking up"  # logged at DEBUG each time beat has looked for due tasks


def reasons(job) -> list[str]:
    return list(Job.objects.get(pk=job.pk).events.values_list("reason", flat=True))


def long_served(job: Job) -> Job:
    """As if the job had run for hours: past its tier's last rung, behind any newer work."""
    Job.objects.filter(pk=job.pk).update(run_ms=10**8)
    return job


def test_a_starved_sp_job_is_promoted_after_three_rounds_runs_and_returns(alice, start_workers, beat):
    # Two SP jobs that have both run for hours, on the only GPU: the first keeps it (within a
    # class nobody is displaced), and the second waits, round after round.
    first = long_served(submit(alice, "SP", "first", steps=1_000_000, step_ms=10, state_kb=1))
    start_workers(1)
    wait_for(lambda: Job.objects.get(pk=first.pk).state == "running", 30)
    starved = long_served(submit(alice, "SP", "starved", steps=1_000_000, step_ms=10, state_kb=1))
    beat(promotion_tick=1)

    # Promoted to HP with its service (a promotion does not make a job new), it comes before the
    # SP job of its level: it takes the GPU until it has had its first rung of service in HP, then
    # goes home, and keeps the GPU (it is the first come now).
    wait_for(lambda: any(r.startswith("returned to SP after") for r in reasons(starved)), 60,
             what="the SP job to be promoted, run and return")  # fmt: skip
    job = Job.objects.get(pk=starved.pk)
    history = reasons(job)
    promoted = next(i for i, r in enumerate(history) if r.startswith("promoted SP -> HP"))
    assert "skipped in 3 consecutive rounds" in history[promoted]
    assert history[promoted].endswith("in the last round")
    assert any(r.startswith("claimed on GPU") for r in history[promoted:])
    assert job.original_tier.code == "SP" and job.slice_count >= 1
    # Back home: it runs (or waits) as an SP job again, and its streak starts over.
    wait_for(lambda: Job.objects.get(pk=starved.pk).tier.code == "SP", 10)
    assert Job.objects.get(pk=starved.pk).state in ("queued", "running")
    assert Job.objects.get(pk=first.pk).state in ("queued", "running")  # it made way, and waits


@pytest.mark.slow  # endless SP work and real beat until the batch chance comes; CI's slow pass runs it
def test_a_bp_job_behind_endless_sp_work_gets_its_slice_once_a_short_interval_is_set(alice, start_workers, beat):
    sp = [submit(alice, "SP", f"sp-{i}", steps=4000, step_ms=10, state_kb=1) for i in range(2)]
    bp = long_served(submit(alice, "BP", "batch", steps=1_000_000, step_ms=10, state_kb=1))
    start_workers(1)
    scheduler = beat()  # the batch chance every 2 h, as seeded
    wait_for(lambda: Job.objects.filter(pk__in=[j.pk for j in sp], slice_count__gte=3).count() == 2, 30)
    looks = scheduler.log_text().count(BEAT_TICK)
    wait_for(lambda: scheduler.log_text().count(BEAT_TICK) >= looks + 3, 30, what="beat to look at its schedule")
    assert "Sending due task clockq: batch chance BP" not in scheduler.log_text()  # no chance yet
    assert Job.objects.get(pk=bp.pk).slice_count == 0
    assert not any(r.startswith("batch chance") for r in reasons(bp))

    set_interval("batch chance BP", 2)  # no restart: beat notices the edit

    wait_for(lambda: any(r.startswith("returned to BP after") for r in reasons(bp)), 30,
             what="the BP job's batch chance")  # fmt: skip
    history = reasons(bp)
    chance = next(i for i, r in enumerate(history) if r.startswith("batch chance: lifted to SP"))
    assert any(r.startswith("claimed on GPU") for r in history[chance:])
    assert Job.objects.get(pk=bp.pk).slice_count >= 1


def test_an_rt_job_that_cannot_start_within_its_timeout_ends_timed_out(alice, start_workers, beat):
    """The only GPU is inside one long step (3 s): nothing can preempt it before the step ends."""
    start_workers(1)
    blocker = submit(alice, "BK", "long-step", steps=2, step_ms=3000, state_kb=1)
    wait_for(lambda: Job.objects.get(pk=blocker.pk).state == "running", 20)
    beat(SLO_check=1)
    rt = submit(alice, "RT", "inference", steps=1, step_ms=1)

    (done,) = wait_finished(rt, timeout=30)
    assert done.state == "timed_out"
    assert done.first_started_at is None and done.slice_count == 0
    assert "start timeout of 1000 ms" in done.events.last().reason
    # A fresh RT job on a free GPU starts well within it.
    wait_finished(blocker, timeout=30)
    (fine,) = wait_finished(submit(alice, "RT", "in-time", steps=1, step_ms=1), timeout=30)
    assert fine.state == "succeeded" and fine.first_started_at is not None  # not timed out


def test_a_running_job_past_its_deadline_ends_timed_out_with_its_checkpoint_kept(alice, start_workers, settings):
    start_workers(1)
    job = submit(alice, "SP", "deadline", steps=1_000_000, step_ms=5, state_kb=4)
    Job.objects.filter(pk=job.pk).update(deadline=timezone.now() + timedelta(seconds=2))

    (done,) = wait_finished(job, timeout=30)
    assert done.state == "timed_out"
    assert done.events.last().reason == "deadline passed while running"
    assert 0 < done.progress < 1 and done.checkpoint_generation >= 1
    # Written in the background once the job left the GPU: it is there, verified, soon after.
    store = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR)
    newest = done.checkpoint_files[0]
    wait_for(lambda: store.path(job.pk, newest).exists(), 10, what="the checkpoint to be persisted")
    assert len(store.read(job.pk, newest)) > 4096


def test_tiers_keep_their_targets(db):
    """The specification's numbers, seeded."""
    tiers = {t.code: t for t in QueueTier.objects.all()}
    assert {c: t.wait_target_ms for c, t in tiers.items()} == {
        "RT": 50, "HP": 60_000, "SP": 600_000, "BP": 4 * 3_600_000, "BK": None,
    }  # fmt: skip
    assert tiers["RT"].start_timeout_ms == 1000
    assert (tiers["SP"].promote_after_rounds, tiers["SP"].promote_to.code) == (3, "HP")
    assert (tiers["BP"].chance_jobs, tiers["BP"].chance_to.code) == (1, "SP")
    assert all(tiers[c].promote_to is None for c in ("RT", "HP", "BP", "BK"))
