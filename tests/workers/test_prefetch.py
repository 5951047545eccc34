"""Prefetch: while the control state has prefetch on, a GPU host builds the data of the queued
jobs likely to run there into its cache, and a job that finds its data there skips building it.
The datasets here are generated (keras_train's teacher network), as the workload's own are."""

from __future__ import annotations

import os

import numpy as np
import pytest

from clockq.bus import dispatch
from clockq.control_state import control
from tests.helpers import submit
from workers import prefetch
from workers.gpus import simulated_gpus
from workers.workloads import keras_train
from workers.workloads.base import RunContext

EXAMPLES = 20_000


@pytest.fixture
def quiet_dispatch(monkeypatch):
    monkeypatch.setattr(dispatch, "send_run_slice", lambda job_id, token, queue, **_kw: None)


def test_a_cached_dataset_is_the_one_a_job_would_build(tmp_path):
    x, y, cached = keras_train.load_or_build_dataset(tmp_path, seed=7, examples=EXAMPLES)
    assert not cached and keras_train.dataset_path(tmp_path, 7, EXAMPLES).exists()
    x2, y2, cached = keras_train.load_or_build_dataset(tmp_path, seed=7, examples=EXAMPLES)
    assert cached and np.array_equal(x, x2) and np.array_equal(y, y2)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".building-")]  # no leftovers


def test_a_damaged_or_unwritable_cache_is_rebuilt_not_the_jobs_fault(tmp_path, caplog):
    x, y, _ = keras_train.load_or_build_dataset(tmp_path, seed=3, examples=EXAMPLES)
    keras_train.dataset_path(tmp_path, 3, EXAMPLES).write_bytes(b"not a dataset")
    x2, y2, cached = keras_train.load_or_build_dataset(tmp_path, seed=3, examples=EXAMPLES)
    assert not cached and np.array_equal(x, x2) and np.array_equal(y, y2)
    assert "unreadable" in caplog.text

    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as root: a read-only folder is still writable")
        x3, _, cached = keras_train.load_or_build_dataset(locked, seed=3, examples=EXAMPLES)
        assert not cached and np.array_equal(x, x3)
        assert "could not cache" in caplog.text
    finally:
        os.chmod(locked, 0o700)


@pytest.mark.django_db
def test_prefetch_builds_the_data_of_queued_jobs_only_while_it_is_on(admin_user, tmp_path, quiet_dispatch):
    gpus = simulated_gpus(1)
    with_data = submit(admin_user, "SP", "train", "keras_train", steps=5, seed=11, dataset_examples=EXAMPLES)
    submit(admin_user, "SP", "stream", "keras_train", steps=5, seed=12)  # streams its batches: nothing to fetch
    submit(admin_user, "HP", "sleep", "synthetic", steps=5)  # no prefetch hook
    path = keras_train.dataset_path(tmp_path, 11, EXAMPLES)

    assert prefetch.prefetch_once(gpus, tmp_path, per_gpu=3) == []  # prefetch is off
    assert not path.exists()

    control.force_state(actor="op", prefetch_on=True)
    assert prefetch.prefetch_once(gpus, tmp_path, per_gpu=3) == [with_data.pk]
    assert path.exists()
    assert prefetch.prefetch_once(gpus, tmp_path, per_gpu=3) == []  # already there: nothing to do


@pytest.mark.django_db
def test_only_the_jobs_next_in_line_that_fit_here_are_prefetched(admin_user, tmp_path, quiet_dispatch):
    gpus = simulated_gpus(1, [8 * 1024])
    control.force_state(actor="op", prefetch_on=True)
    first = submit(admin_user, "HP", "first", "keras_train", steps=5, seed=1, dataset_examples=EXAMPLES)
    services_job = submit(admin_user, "HP", "too big", "keras_train", steps=5, seed=2, dataset_examples=EXAMPLES)
    services_job.gpu_mem_mib = 40 * 1024
    services_job.save(update_fields=["gpu_mem_mib"])
    submit(admin_user, "BK", "later", "keras_train", steps=5, seed=3, dataset_examples=EXAMPLES)
    assert prefetch.prefetch_once(gpus, tmp_path, per_gpu=1) == [first.pk]
    assert not keras_train.dataset_path(tmp_path, 2, EXAMPLES).exists()
    assert not keras_train.dataset_path(tmp_path, 3, EXAMPLES).exists()


def test_a_job_whose_data_was_prefetched_finds_it_and_trains_on_the_same_batches(tmp_path):
    params = {"steps": 3, "batch_size": 8, "hidden": 4, "learning_rate": 1e-3, "seed": 5, "dataset_examples": EXAMPLES}
    assert keras_train.KerasTrainWorkload.prefetch(params, tmp_path) is True
    warm = keras_train.KerasTrainWorkload(params)
    warm.setup(RunContext(1, 0, tmp_path / "w1", cache_dir=tmp_path))
    cold = keras_train.KerasTrainWorkload(params)
    cold.setup(RunContext(2, 0, tmp_path / "w2", cache_dir=tmp_path / "empty"))
    assert warm.data_from_cache and not cold.data_from_cache
    for step in range(3):
        for a, b in zip(warm._batch(step), cold._batch(step), strict=True):
            assert np.array_equal(a, b)
