"""Drain and resume on real GPU workers: a drained GPU's running job checkpoints and goes back
to its queue, the worker stops taking jobs (and stays drained across a restart), /api/queues and
/healthz say so, and resume brings it back."""

from __future__ import annotations

import json
import os
import signal
import socket

import pytest
from django.test import Client
from django.utils import timezone

from clockq.bus.client import client
from clockq.bus.heartbeat import KEY_PREFIX
from clockq.jobs.models import Job, Slice
from tests.harness import wait_for
from tests.helpers import assert_no_overlap, submit, wait_finished

pytestmark = pytest.mark.integration

HOST = socket.gethostname()


def _beat(name: str) -> dict | None:
    raw = client().get(KEY_PREFIX + name)
    return json.loads(raw) if raw else None


def _consuming(name: str, want: bool):
    def check():
        beat = _beat(name)
        return beat is not None and beat.get("consuming") is want

    return check


def _staff(carol) -> Client:
    staff = Client()
    staff.force_login(carol)
    return staff


def test_a_drained_gpu_hands_its_job_on_takes_no_other_and_takes_jobs_again_once_resumed(start_workers, alice, carol):
    # Given two GPUs, each running a long job
    start_workers(gpus=2, CLOCKQ_CHECKPOINT_EVERY_S="0.2")
    jobs = [submit(alice, "SP", f"long-{i}", steps=400, step_ms=10, state_kb=4) for i in range(2)]
    wait_for(lambda: Job.objects.filter(state="running").count() == 2, 30, what="both jobs to run")
    drained, other = f"gpu0@{HOST}", f"gpu1@{HOST}"
    victim = Job.objects.get(worker=drained, state="running")
    staff = _staff(carol)

    # When an operator drains gpu0
    answer = staff.post(f"/api/workers/{drained}/drain", {"reason": "fan swap"}, content_type="application/json")

    # Then it is drained at once, and within a heartbeat it takes no job
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["drained"] and body["drained_by"] == "carol" and body["drain_reason"] == "fan swap"
    wait_for(_consuming(drained, False), 30, what="gpu0 to stop taking jobs")
    # Its job checkpoints and goes back to its queue, and finishes on gpu1
    wait_for(lambda: not staff.get(f"/api/workers/{drained}").json()["running_jobs"], 30, what="gpu0 to empty")
    drained_at = Job.objects.get(pk=victim.pk).events.filter(reason__contains="drained by carol").get().at
    finished = wait_finished(*jobs, timeout=120)
    assert all(j.state == "succeeded" for j in finished)
    victim.refresh_from_db()
    assert victim.slices.filter(outcome="yielded").exists()
    # No other job ran there since. Its own job may have begun one more slice: a boundary that
    # met the drain while it wrote a continue starts the next slice, which ends at the next step.
    since = Slice.objects.filter(worker=drained, started_at__gt=drained_at)
    assert not since.exclude(job=victim).exists()
    assert [s.outcome for s in since.filter(job=victim)] in ([], ["yielded"])
    assert victim.failures == 0
    assert_no_overlap(victim)
    # /api/queues and /healthz show it drained; gpu1 still makes the system healthy
    workers = {w["hostname"]: w for w in staff.get("/api/queues").json()["workers"]}
    assert "carol" in workers[drained]["drained"] and workers[other]["drained"] is None
    assert workers[drained]["consuming"] is False and workers[other]["consuming"] is True
    health = staff.get("/healthz")
    assert health.status_code == 200 and drained in health.json()["checks"]["workers"]["drained"]

    # And a drained worker that restarts stays drained
    os.kill(_beat(drained)["pid"], signal.SIGKILL)
    old_pid = _beat(drained)["pid"]
    wait_for(lambda: (_beat(drained) or {}).get("pid") not in (None, old_pid), 60, what="gpu0 to be restarted")
    wait_for(_consuming(drained, False), 30, what="the restarted gpu0 to stay drained")

    # When it is resumed, it takes jobs again
    assert staff.post(f"/api/workers/{drained}/resume").json()["drained"] is False
    wait_for(_consuming(drained, True), 30, what="gpu0 to take jobs again")
    more = [submit(alice, "SP", f"after-{i}", steps=60, step_ms=10) for i in range(4)]
    wait_finished(*more, timeout=120)
    assert Slice.objects.filter(job__in=more, worker=drained).exists()


def test_a_drained_host_takes_no_job_and_healthz_says_so(start_workers, alice, carol):
    start_workers(gpus=2)
    staff = _staff(carol)
    job = submit(alice, "SP", "long", steps=300, step_ms=10, state_kb=4)
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "running", 30, what="the job to run")

    answer = staff.post(f"/api/hosts/{HOST}/drain", content_type="application/json")

    assert answer.status_code == 200 and answer.json()["drained"]
    for gpu in (0, 1):
        wait_for(_consuming(f"gpu{gpu}@{HOST}", False), 30, what=f"gpu{gpu} to stop taking jobs")
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "queued", 30, what="the job to go back to its queue")
    health = staff.get("/healthz")
    assert health.status_code == 503  # every GPU is drained: nothing can run a job
    assert set(health.json()["checks"]["workers"]["drained"]) == {f"gpu0@{HOST}", f"gpu1@{HOST}"}
    # A GPU of a drained host is resumed with its host
    refused = staff.post(f"/api/workers/gpu0@{HOST}/resume")
    assert refused.status_code == 409 and "resume the host" in refused.json()["detail"]

    staff.post(f"/api/hosts/{HOST}/resume")

    (job,) = wait_finished(job, timeout=120)
    assert job.state == "succeeded" and job.failures == 0


@pytest.mark.slow  # about 22 s; the GPU's own drain is test_a_drained_gpu_hands_its_job_on_... (CI's slow pass runs it)
def test_a_gpus_rt_lane_is_drained_and_resumed_with_its_gpu_and_its_host(start_workers, alice, carol):
    # Given a GPU with its standby RT lane
    start_workers(gpus=1, CLOCKQ_RT_LANE="on")
    main, lane = f"gpu0@{HOST}", f"rt0@{HOST}"
    wait_for(_consuming(lane, True), 60, what="the RT lane to take jobs")
    staff = _staff(carol)

    # When the GPU is drained, its lane takes no RT job either; resumed, it takes them again
    staff.post(f"/api/workers/{main}/drain", content_type="application/json")
    wait_for(_consuming(lane, False), 30, what="the lane to stop with its GPU")
    status = staff.get(f"/api/workers/{main}").json()
    assert status["rt_lane"] == {"name": lane, "consuming": False, "running_jobs": []}
    queues = {w["hostname"]: w for w in staff.get("/api/queues").json()["workers"]}
    assert main in queues[lane]["drained"]
    staff.post(f"/api/workers/{main}/resume")
    wait_for(_consuming(lane, True), 30, what="the lane to take jobs again with its GPU")

    # And the same with its host's drain: an RT job sent meanwhile waits for the resume
    staff.post(f"/api/hosts/{HOST}/drain", content_type="application/json")
    wait_for(_consuming(main, False), 30, what="gpu0 to stop taking jobs")
    wait_for(_consuming(lane, False), 30, what="the lane to stop with its host")
    rt = submit(alice, "RT", "urgent", steps=5, step_ms=5)
    resumed_at = timezone.now()
    staff.post(f"/api/hosts/{HOST}/resume")
    wait_for(_consuming(lane, True), 30, what="the lane to take jobs again with its host")
    (rt,) = wait_finished(rt, timeout=60)
    assert rt.state == "succeeded"
    assert rt.slices.order_by("started_at").first().started_at >= resumed_at
