"""A full checkpoint disk is the infrastructure's fault, never the job's: jobs go back to their
queue uncharged, the worker backs off and says it is degraded, and everything finishes once the
disk has room again. A real fault: the checkpoints live on a 2 MiB tmpfs that fills up."""

from __future__ import annotations

import pytest

from clockq.bus import heartbeat
from clockq.jobs.models import Job, Slice
from tests.harness import fill, wait_for
from tests.helpers import submit, wait_finished

pytestmark = pytest.mark.integration


def test_a_full_checkpoint_disk_charges_no_job_and_everything_finishes_once_it_has_room(
    start_workers, alice, carol, settings, tiny_filesystem, client
):
    settings.CLOCKQ_CHECKPOINT_DIR = tiny_filesystem / "checkpoints"
    start_workers(gpus=1)
    # Given a full disk and three jobs that take turns, so each must checkpoint to yield
    fill(tiny_filesystem)
    jobs = [submit(alice, "SP", f"j{i}", steps=30, step_ms=5, state_kb=256) for i in range(3)]

    # When their checkpoints fail
    wait_for(lambda: Slice.objects.filter(outcome="fault").count() >= 2, 60, what="checkpoint writes to fail")
    wait_for(heartbeat.degraded_workers, 10, what="the worker to report itself degraded")

    # Then the worker says why, /healthz says the system cannot keep work, and no job is charged
    (reason,) = heartbeat.degraded_workers().values()
    assert "No space left on device" in reason
    client.force_login(carol)  # the detail is for staff
    health = client.get("/healthz")
    assert health.status_code == 503 and health.json()["checks"]["workers"]["degraded"]
    client.force_login(alice)
    (worker,) = client.get("/api/queues").json()["workers"]
    assert "No space left on device" in worker["degraded"]
    assert not Job.objects.filter(failures__gt=0).exists()
    assert not Job.objects.filter(state="failed").exists()

    # And once the disk has room again, every job finishes, none failed, the mark is gone
    for filler in tiny_filesystem.glob("filler*"):
        filler.unlink()
    for job in wait_finished(*jobs, timeout=120):
        assert job.state == "succeeded" and job.failures == 0
    faults = Slice.objects.filter(job__in=jobs, outcome="fault")
    assert faults.exists()
    events = list(Job.objects.get(pk=faults.first().job_id).events.filter(reason__contains="storage failed"))
    assert events and all("not counted against the job" in e.reason for e in events)
    wait_for(lambda: not heartbeat.degraded_workers(), 10, what="the degraded mark to clear")
    assert not list(settings.CLOCKQ_CHECKPOINT_DIR.rglob("*.tmp-*"))  # no partial checkpoint left
