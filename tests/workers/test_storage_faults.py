"""A full checkpoint disk is the infrastructure's fault, never the job's: the job on the GPU keeps
it and its work (making way would need a checkpoint), none is charged, the worker says it is
degraded, and the jobs take turns again once the disk has room. A real fault: the checkpoints
live on a 2 MiB tmpfs that fills up."""

from __future__ import annotations

import pytest
from django.utils import timezone

from clockq.bus import heartbeat
from clockq.jobs.models import Job, Slice
from tests.harness import fill, wait_for
from tests.helpers import submit, wait_finished

# slow: three jobs' 30 s of steps on one GPU through a full disk and back (CI's slow pass runs it).
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_on_a_full_checkpoint_disk_the_running_job_keeps_its_gpu_and_switching_resumes_once_it_has_room(
    start_workers, alice, carol, settings, tiny_filesystem, client
):
    settings.CLOCKQ_CHECKPOINT_DIR = tiny_filesystem / "checkpoints"
    start_workers(gpus=1)
    # Given three jobs that take turns on one GPU
    jobs = [submit(alice, "SP", f"j{i}", steps=2000, step_ms=5, state_kb=64) for i in range(3)]
    wait_for(lambda: Slice.objects.filter(outcome="yielded").exists(), 60, what="the jobs to take turns")

    # When the disk fills up, and the worker finds out (its next checkpoint cannot be written)
    fill(tiny_filesystem)
    wait_for(heartbeat.degraded_workers, 60, what="the worker to report its storage failing")
    since = timezone.now()

    # Then the job on the GPU keeps it and goes on working, slice after slice, without switching
    def kept():
        return Slice.objects.filter(started_at__gt=since, outcome="continued")

    wait_for(lambda: kept().count() >= 5, 60, what="the running job to keep its GPU")
    assert kept().filter(steps__gt=0).exists()  # working, not only waiting
    assert not Slice.objects.filter(started_at__gt=since, outcome__in=["yielded", "fault"]).exists()
    # and /healthz shows staff why
    client.force_login(carol)
    health = client.get("/healthz").json()
    (reason,) = health["checks"]["workers"]["degraded"].values()
    assert "No space left on device" in reason
    assert not Job.objects.filter(failures__gt=0).exists()
    # A full store takes no write at all: its fault is not counted toward any job.
    assert not Job.objects.filter(storage_faults__gt=0).exists()

    # And once the disk has room again, the jobs take turns again, and all finish, uncharged
    for filler in tiny_filesystem.glob("filler*"):
        filler.unlink()
    wait_for(lambda: not heartbeat.degraded_workers(), 30, what="the degraded mark to clear")
    for job in wait_finished(*jobs, timeout=180):
        assert job.state == "succeeded" and job.failures == 0 and job.progress == 1.0
    assert Slice.objects.filter(started_at__gt=since, outcome="yielded").exists()
    assert not Slice.objects.filter(outcome="fault").exists()
    assert not list(settings.CLOCKQ_CHECKPOINT_DIR.rglob("*.tmp-*"))  # no partial checkpoint left
