"""Warm resume: a job that comes back to the worker that yielded it skips the checkpoint load,
while the durable checkpoint is still written for any other worker."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings

from clockq.jobs.checkpoints import CheckpointStore, checkpoint_name
from clockq.jobs.models import Job
from tests.harness import WatchedEvent, wait_for
from tests.helpers import submit, yield_once
from workers.runtime import Runtime, WorkerIdentity
from workers.slice_runner import RunOutcome, run_dispatch
from workers.warm_cache import WarmCache
from workers.workloads.synthetic import SyntheticWorkload

pytestmark = pytest.mark.django_db(transaction=True)


# Without the overhead rule: on a loaded machine a slow first claim would stretch the next slice
# past the job's remaining 0.4 s of work, and it would finish instead of yielding.
@override_settings(CLOCKQ_OVERHEAD_BUDGET=0)
def test_the_same_worker_resumes_warm_and_another_worker_from_the_file(alice):
    job = submit(alice, "SP", "warm", steps=400, step_ms=1, state_kb=64)
    here = Runtime(WorkerIdentity("gpu0@test", 0))
    job = yield_once(job, here)
    assert job.checkpoint_generation == 1
    store = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR)
    (first,) = job.checkpoint_files
    assert store.read(job.pk, first)  # the durable checkpoint was written anyway

    # Damage the file: a warm resume does not read it, so it does not notice.
    path = store.path(job.pk, first)
    path.write_bytes(path.read_bytes()[:-10])
    job = yield_once(job, here)
    assert job.checkpoint_generation == 2
    assert job.checkpoint_files[1] == first
    assert not job.events.filter(reason__contains="unusable").exists()

    # Another worker has no warm copy: it reads generation 2 from disk.
    elsewhere = Runtime(WorkerIdentity("gpu1@test", 1))
    path = store.path(job.pk, job.checkpoint_files[0])
    path.write_bytes(path.read_bytes()[:-10])
    job = yield_once(job, elsewhere)
    assert job.events.filter(reason__contains="generation 2 unusable").exists()


@override_settings(CLOCKQ_OVERHEAD_BUDGET=0)
def test_a_warm_copy_is_not_used_once_the_job_moved_on_elsewhere(alice):
    """The cache checks the claim it was saved under: after another worker checkpointed the job,
    the first worker's live copy is stale, even if it were at the same generation number."""
    job = submit(alice, "SP", "moved-on", steps=400, step_ms=1, state_kb=4)
    here, elsewhere = Runtime(WorkerIdentity("gpu0@test", 0)), Runtime(WorkerIdentity("gpu1@test", 1))
    job = yield_once(job, here)
    job = yield_once(job, elsewhere)  # from the file; generation 2 is the other worker's
    steps_before = sum(job.slices.values_list("steps", flat=True))

    job = yield_once(job, here)

    # It restored (from generation 2's file), so its steps carry on from there.
    last = job.slices.order_by("-id").first()
    assert last.restore_ms > 0
    assert job.progress == pytest.approx((steps_before + last.steps) / 400)


@override_settings(CLOCKQ_OVERHEAD_BUDGET=0)
def test_a_warm_resume_reads_no_metric_curves_and_updates_them_in_place(alice):
    """A switch back to the same worker re-reads nothing it already knows: the curves saved with
    the checkpoint come back with the live workload, and each is then updated in one statement."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from clockq.jobs import metrics

    job = submit(alice, "SP", "curves", steps=400, step_ms=1, state_kb=4)
    here = Runtime(WorkerIdentity("gpu0@test", 0))
    job = yield_once(job, here)
    with CaptureQueriesContext(connection) as queries:
        job = yield_once(job, here)
    metric_sql = [q["sql"] for q in queries.captured_queries if "jobs_jobmetric" in q["sql"]]
    assert len(metric_sql) == 1 and metric_sql[0].startswith("UPDATE"), metric_sql
    assert metrics.curves(job.pk)["loss"]["latest"][0] == sum(job.slices.values_list("steps", flat=True))


def _workload(tmp_path, job_id=1):
    from workers.workloads.base import RunContext

    w = SyntheticWorkload(
        {"steps": 10, "step_ms": 0, "state_kb": 1, "gpu_util": 0.5, "fail_at_step": -1, "fail_times": 0}
    )
    w.setup(RunContext(job_id, 0, tmp_path))
    return w


def test_the_cache_respects_its_bounds_and_checkpoints(tmp_path):
    cache = WarmCache(max_bytes=3000, max_jobs=2)
    a, b, c = (_workload(tmp_path, i) for i in (1, 2, 3))
    name = checkpoint_name(5, "a" * 32)
    cache.put(1, name, a, 1000)
    cache.put(2, name, b, 1000)
    cache.put(3, name, c, 1000)  # over max_jobs: the oldest (job 1) goes
    assert cache.take(1, name) is None
    assert cache.take(2, checkpoint_name(5, "b" * 32)) is None  # another claim's: stale, dropped
    assert cache.take(2, name) is None
    assert cache.take(3, name).workload is c
    cache.put(4, name, _workload(tmp_path, 4), 10_000)  # larger than the whole cache
    assert len(cache) == 0


@override_settings(CLOCKQ_OVERHEAD_BUDGET=0)
def test_a_yielded_jobs_checkpoint_is_written_once_the_next_job_has_started(alice, monkeypatch):
    """Written at once, its fsync would hold up the switch's own commits on the same disk."""
    monkeypatch.setattr("workers.persister.SWITCH_QUIET_S", 60.0)
    job = submit(alice, "SP", "yields", steps=400, step_ms=1, state_kb=64)
    rival = submit(alice, "SP", "next", steps=1)
    here = Runtime(WorkerIdentity("gpu0@test", 0))
    # Each dispatch runs one job: no hand-over to the rival, and no warm job taken after it.
    monkeypatch.setattr("workers.slice_runner._hand_over", lambda *_args: None)
    switch_done = here.persister._switch_done = WatchedEvent()
    switch_done.set()
    assert run_dispatch(job.pk, job.dispatch_token, here) == RunOutcome.YIELDED
    (name,) = Job.objects.get(pk=job.pk).checkpoint_files

    assert switch_done.waited.wait(10)  # the writer has it, and waits for the switch
    assert here.persister.pending(job.pk, name) is not None  # held while the switch is under way
    store = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR)
    assert not store.path(job.pk, name).exists()

    rival = Job.objects.get(pk=rival.pk)
    assert run_dispatch(rival.pk, rival.dispatch_token, here) == RunOutcome.SUCCEEDED
    wait_for(lambda: here.persister.pending(job.pk, name) is None, 10)  # the next job started: written
    assert not switch_done.timed_out.is_set()
    assert store.read(job.pk, name)


@override_settings(CLOCKQ_OVERHEAD_BUDGET=0, CLOCKQ_RT_LANE=True)
def test_a_job_that_leaves_to_give_an_rt_job_its_memory_is_not_kept_warm(alice, monkeypatch):
    """The lane's checkpoint path (workers/rt_lane.py): the RT job does not fit beside the job,
    so the job leaves; a warm copy would keep the GPU memory the RT job needs."""
    from clockq.bus import lanes
    from clockq.bus.client import client

    monkeypatch.setattr("workers.slice_runner._hand_over", lambda *_args: None)
    job = submit(alice, "SP", "big", steps=400, step_ms=1, state_kb=64)
    rt = submit(alice, "RT", "does-not-fit", steps=1)
    Job.objects.filter(pk=rt.pk).update(state="running", worker="rt0@test")  # the lane took it
    here = Runtime(WorkerIdentity("gpu0@test", 0))
    request = lanes.PauseRequest(rt_job=rt.pk, lane="rt0@test", mode=lanes.MODE_CHECKPOINT, target=job.pk)
    monkeypatch.setattr(lanes, "PAUSE_TTL_S", 600.0)  # no lane here to renew it
    lanes.request_pause(client(), "gpu0@test", request)

    assert run_dispatch(job.pk, job.dispatch_token, here) == RunOutcome.YIELDED

    job = Job.objects.get(pk=job.pk)
    assert job.state == "queued" and job.checkpoint_generation == 1
    assert job.events.filter(reason__contains=f"RT job #{rt.pk} in this GPU's RT lane").exists()
    assert job.pk not in here.stores.warm
