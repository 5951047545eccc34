"""A finished job keeps what it produced: real workers store the result before the job counts
as succeeded, and its owner (or staff) downloads it; anyone else gets the job's 404."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pytest

from clockq.jobs.models import Job
from tests.harness import wait_for
from tests.helpers import submit, token_auth, wait_finished

pytestmark = pytest.mark.integration


def download(client, user, url):
    response = client.get(url, **token_auth(user))
    return response, b"".join(response.streaming_content) if response.status_code == 200 else b""


def test_a_sliced_job_succeeds_with_its_result_and_only_its_owner_and_staff_get_it(
    client, alice, bob, carol, start_workers
):
    start_workers(1)
    # Two jobs of one tier take turns, so each result comes from a job resumed several times.
    jobs = [submit(alice, "SP", f"synthetic-{i}", steps=40, step_ms=5, state_kb=8) for i in range(2)]
    matmul = submit(alice, "SP", "matmul", workload="matmul", steps=30, size=32)
    *done, m = wait_finished(*jobs, matmul, timeout=90)

    for job in done:
        assert job.state == "succeeded" and job.slice_count > 1
        assert [f["name"] for f in job.result_files] == ["state.bin"]
        manifest = client.get(f"/api/jobs/{job.pk}/result", **token_auth(alice)).json()
        assert manifest["bytes"] == job.result_bytes == manifest["files"][0]["bytes"]
        response, body = download(client, alice, f"/api/jobs/{job.pk}/result/state.bin")
        assert response.status_code == 200
        assert response["X-Checksum-SHA256"] == hashlib.sha256(body).hexdigest() == manifest["files"][0]["sha256"]
        assert int(response["Content-Length"]) == len(body)
        assert int.from_bytes(body[:8], "little") == 40  # the synthetic state: all 40 steps done
        assert download(client, carol, f"/api/jobs/{job.pk}/result/state.bin")[0].status_code == 200
        for path in (f"/api/jobs/{job.pk}/result", f"/api/jobs/{job.pk}/result/state.bin"):
            assert client.get(path, **token_auth(bob)).status_code == 404
        client.force_login(alice)
        assert f"/jobs/{job.pk}/result/state.bin" in client.get(f"/jobs/{job.pk}/").content.decode()

    assert m.state == "succeeded"
    _response, body = download(client, alice, f"/api/jobs/{m.pk}/result/matrix.npy")
    matrix = np.load(io.BytesIO(body), allow_pickle=False)
    assert matrix.shape == (32, 32) and np.isfinite(matrix).all()
    assert client.get(f"/api/jobs/{m.pk}/result/nope.bin", **token_auth(alice)).status_code == 404


def test_a_job_that_has_not_finished_has_no_result(client, alice, db):
    job = submit(alice, "SP", "waiting")
    assert client.get(f"/api/jobs/{job.pk}/result", **token_auth(alice)).status_code == 404


def test_a_worker_lost_between_storing_the_result_and_the_final_write_costs_a_rerun_only(
    alice, start_workers, settings
):
    """The worker stored a result, then died before it marked the job succeeded: the reaper
    takes the job back, it runs again from its last checkpoint, stores its result again and
    succeeds once."""
    from datetime import timedelta

    from django.utils import timezone

    from clockq.jobs.models import Job
    from clockq.jobs.results import ResultStore
    from control.reaper import reap_expired_leases

    job = submit(alice, "SP", "crashed", steps=20, step_ms=1, state_kb=1)
    results = ResultStore(settings.CLOCKQ_CHECKPOINT_DIR)
    staged = results.staging(job.pk)
    (staged / "state.bin").write_bytes(b"written by the worker that died")
    results.store(job.pk, staged)
    past = timezone.now() - timedelta(seconds=5)
    Job.objects.filter(pk=job.pk).update(state="running", worker="gpu0@lost", lease_expires_at=past)
    assert reap_expired_leases() == 1
    start_workers(1)

    (done,) = wait_finished(job, timeout=60)

    assert done.state == "succeeded"
    assert done.events.filter(to_state="succeeded").count() == 1
    with results.open(job.pk, "state.bin") as fh:
        body = fh.read()
    assert int.from_bytes(body[:8], "little") == 20  # the rerun's own result replaced the other
    assert done.result_files[0]["sha256"] == hashlib.sha256(body).hexdigest()


def test_metrics_are_recorded_at_checkpoints_and_served_to_the_owner_only(client, alice, bob, start_workers):
    start_workers(1)
    jobs = [submit(alice, "SP", f"curve-{i}", steps=60, step_ms=5, state_kb=1) for i in range(2)]
    matmul = submit(alice, "SP", "residual", workload="matmul", steps=20, size=16)
    *done, m = wait_finished(*jobs, matmul, timeout=90)

    for job in done:
        answer = client.get(f"/api/jobs/{job.pk}/metrics", **token_auth(alice)).json()
        points = answer["metrics"]["loss"]["points"]
        assert [step for step, _ in points] == list(range(1, 61))  # every step, once
        assert points[-1] == [60, 1 / 60] and answer["metrics"]["loss"]["latest"] == [60, 1 / 60]
        yields = [end for end in answer["slice_ends"] if end["outcome"] == "yielded"]
        assert yields and all(0 < end["step"] < 60 for end in yields)  # they took turns
        assert client.get(f"/api/jobs/{job.pk}/metrics", **token_auth(bob)).status_code == 404
    residual = client.get(f"/api/jobs/{m.pk}/metrics", **token_auth(alice)).json()["metrics"]["residual"]["points"]
    assert len(residual) == 20

    client.force_login(alice)
    page = client.get(f"/jobs/{done[0].pk}/").content.decode()
    assert 'id="metrics-chart"' in page and "plotly.min.js" in page
    listing = client.get("/jobs/").content.decode()
    assert "loss 0.0167" in listing


@pytest.mark.slow  # about 35 s: every cold resume rebuilds the model (tests/workloads covers it in process)
def test_a_keras_job_sliced_and_resumed_cold_keeps_the_model_an_unsliced_run_trains(alice, start_workers, settings):
    """Cold resumes only (no warm cache), two GPUs, rivals in the same tier: the stored model
    loads with keras.models.load_model and its weights equal a straight run's, bitwise. (Which
    GPU it resumes on is the order's choice: the one whose job makes way first.)"""
    import keras

    from clockq.jobs import workloads
    from clockq.jobs.results import ResultStore
    from clockq.jobs.services import cancel_job
    from workers.workloads.base import RunContext
    from workers.workloads.keras_train import KerasTrainWorkload

    params = {"steps": 150, "batch_size": 16, "hidden": 8, "seed": 5}  # it outlasts its first slice
    start_workers(2, CLOCKQ_WARM_CACHE_JOBS="0", CLOCKQ_OVERHEAD_BUDGET="0")
    job = submit(alice, "SP", "keras", workload="keras_train", **params)
    # Rivals that outlast it, new once it has run (its first claim imports TensorFlow, some
    # seconds): ordered by attained service, the three take turns at each rung of the ladder.
    wait_for(lambda: Job.objects.get(pk=job.pk).slice_count >= 1, 120, what="the Keras job's first slice")
    rivals = [submit(alice, "SP", f"rival-{i}", steps=100_000, step_ms=5, state_kb=1) for i in range(2)]
    (done,) = wait_finished(job, timeout=180)
    for rival in rivals:
        cancel_job(rival, actor="test")
    assert done.state == "succeeded"
    assert done.slices.filter(outcome="yielded").count() >= 1  # and resumed from its file

    results = ResultStore(settings.CLOCKQ_CHECKPOINT_DIR)
    model = keras.models.load_model(results.folder(done.pk) / "model.keras")
    straight = KerasTrainWorkload(workloads.validate("keras_train", params, may_run_commands=False))
    straight.setup(RunContext(job_id=done.pk, gpu_index=0, work_dir=settings.CLOCKQ_CHECKPOINT_DIR / "straight"))
    while straight.step() < 1.0:
        pass
    for got, want in zip(model.get_weights(), straight.model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
