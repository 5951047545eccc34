"""Jobs run in time slices on real GPU worker processes, through a real Redis broker."""

from __future__ import annotations

import base64
import itertools
import json

import pytest
from django.conf import settings

from clockq.jobs.checkpoints import CheckpointStore
from clockq.jobs.models import Job, Slice
from clockq.policy.ordering import BASE_LADDER_GPU_S
from tests.harness import wait_for
from tests.helpers import assert_no_overlap, claims, post_form, submit, wait_finished

pytestmark = pytest.mark.integration

# These tests are about the slicing mechanism at the tier's base slice; the overhead rule
# (tested in test_dynamic_slices.py) would stretch slices once a job has switched.
FIXED_SLICES = {"CLOCKQ_OVERHEAD_BUDGET": "0"}


def test_jobs_from_the_form_and_the_api_finish_in_slices_with_verified_checkpoints(start_workers, client, alice):
    start_workers(gpus=1, **FIXED_SLICES)
    client.force_login(alice)
    params = {"steps": 40, "step_ms": 10, "state_kb": 32}
    form = {"name": "from-form", "tier": "SP", "workload": "synthetic", "params": json.dumps(params)}
    response = post_form(client, "/jobs/new", form)
    assert response.status_code == 302, response.content[:500]
    auth = "Basic " + base64.b64encode(b"alice:alice-pass-123").decode()
    response = client.generic(
        "POST",
        "/api/jobs",
        json.dumps({"name": "from-api", "tier": "SP", "workload": "synthetic", "params": params}),
        content_type="application/json",
        HTTP_AUTHORIZATION=auth,
    )
    assert response.status_code == 201, response.content[:500]

    jobs = wait_finished(*Job.objects.all())

    store = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR)
    for job in jobs:
        assert job.state == "succeeded"
        assert job.progress == 1.0
        assert job.slice_count >= 3
        assert job.slices.count() == job.slice_count
        yielded = job.slices.filter(outcome="yielded")
        assert yielded.exists() and all(s.checkpoint_bytes > 32 * 1024 for s in yielded)
        # The newest checkpoint on disk passes its checksum and holds the synthetic state.
        assert len(store.read(job.pk, job.checkpoint_files[0])) == 16 + 32 * 1024


def test_two_jobs_sharing_a_gpu_take_turns_as_their_service_grows(start_workers, alice):
    start_workers(gpus=1, **FIXED_SLICES)
    a = submit(alice, "SP", "a", steps=30, step_ms=10, state_kb=4)
    b = submit(alice, "SP", "b", steps=30, step_ms=10, state_kb=4)
    a, b = wait_finished(a, b)

    owners = list(Slice.objects.order_by("started_at").values_list("job_id", flat=True))
    switches = sum(x != y for x, y in itertools.pairwise(owners))
    # They interleave: each makes way when its service passes a rung of the ladder that the
    # other's has not (tests.helpers.SHORT_LADDER: doubling rungs), not at every slice end.
    assert b.first_started_at < a.finished_at and a.first_started_at < b.finished_at
    assert 2 <= switches < len(owners) - 1, owners
    assert a.slices.filter(outcome="yielded").exists() and b.slices.filter(outcome="yielded").exists()


def test_a_lone_job_on_an_idle_pool_never_switches(start_workers, alice):
    start_workers(gpus=1)
    job = submit(alice, "SP", "lone", steps=25, step_ms=10, state_kb=4)
    (job,) = wait_finished(job)

    outcomes = list(job.slices.values_list("outcome", flat=True))
    assert job.state == "succeeded"
    assert len(outcomes) >= 3
    assert outcomes == ["continued"] * (len(outcomes) - 1) + ["completed"]
    assert claims(job) == 1
    assert not job.events.filter(from_state="running", to_state="queued").exists()


def test_rt_job_starts_before_ten_waiting_bk_jobs_on_a_busy_gpu(start_workers, alice, settings):
    # The default ladder: no job of the test passes a rung, so the BK jobs wait behind the busy
    # SP job (a new BK job would otherwise come before a long-served SP one).
    settings.CLOCKQ_SERVICE_LADDER_S = list(BASE_LADDER_GPU_S)
    start_workers(gpus=1)
    busy = submit(alice, "SP", "busy", steps=80, step_ms=10)
    wait_for(lambda: Job.objects.get(pk=busy.pk).state == "running", 20, what="the busy job to start")
    bk = [submit(alice, "BK", f"bk{i}", steps=3, step_ms=5) for i in range(10)]
    rt = submit(alice, "RT", "rt", steps=2, step_ms=5)

    jobs = wait_finished(busy, rt, *bk)
    by_name = {j.name: j for j in jobs}
    rt_started = by_name["rt"].first_started_at
    assert all(rt_started < by_name[f"bk{i}"].first_started_at for i in range(10))
    # The busy SP job made way for RT at a slice boundary.
    assert by_name["busy"].slices.filter(outcome="yielded").exists()
    for job in jobs:
        assert job.state == "succeeded"
        assert_no_overlap(job)
