"""The `keras_train` workload: a real Keras model, checkpointed and resumed exactly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clockq.jobs import workloads
from tests.helpers import submit, wait_finished
from workers.data_cache import MB
from workers.workloads.base import RunContext
from workers.workloads.keras_train import KerasTrainWorkload, dataset_bytes, generated_batch

ROOT = Path(__file__).resolve().parents[2]


def make(tmp_path: Path, **params) -> KerasTrainWorkload:
    w = KerasTrainWorkload(workloads.validate("keras_train", params, may_run_commands=False))
    w.setup(RunContext(job_id=1, gpu_index=0, work_dir=tmp_path))
    return w


def run(w: KerasTrainWorkload, n: int) -> list[float]:
    losses = []
    for _ in range(n):
        w.step()
        losses.append(w.last_loss)
    return losses


def test_importing_the_module_does_not_import_tensorflow():
    code = "import sys, workers.workloads.keras_train; sys.exit('tensorflow' in sys.modules or 'keras' in sys.modules)"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_generated_data_is_deterministic_per_step():
    x1, y1 = generated_batch(5, 3, 8)
    x2, y2 = generated_batch(5, 3, 8)
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
    assert not np.array_equal(generated_batch(5, 4, 8)[0], x1)
    assert x1.dtype == y1.dtype == np.float32 and y1.shape == (8, 1)


def test_trains_and_loss_decreases(tmp_path):
    w = make(tmp_path, steps=50)
    progress, losses = [], []
    for _ in range(50):
        progress.append(w.step())
        losses.append(w.last_loss)
    assert progress == pytest.approx([(i + 1) / 50 for i in range(50)])
    assert progress[-1] == 1.0
    assert all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    assert w.step() == 1.0  # done: a further step trains no more
    assert int(w.optimizer.iterations.numpy()) == 50
    assert w.declared_gpu_util() == 0.7


def test_resume_matches_an_uninterrupted_run(tmp_path):
    params = {"steps": 100, "batch_size": 32, "hidden": 16, "seed": 11}
    straight = make(tmp_path / "a", **params)
    straight_losses = run(straight, 12)

    first = make(tmp_path / "b", **params)
    assert run(first, 8) == straight_losses[:8]
    state = first.state_dict()
    weights, moments = first.model.get_weights(), [v.numpy() for v in first.optimizer.variables]

    resumed = make(tmp_path / "c", **params)
    resumed.load_state_dict(state)
    for got, want in zip(resumed.model.get_weights(), weights, strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(resumed.optimizer.variables, moments, strict=True):
        np.testing.assert_array_equal(got.numpy(), want)
    assert int(resumed.optimizer.iterations.numpy()) == 8
    assert resumed.done == 8

    assert run(resumed, 4) == straight_losses[8:]
    for got, want in zip(resumed.model.get_weights(), straight.model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)

    # A periodic checkpoint: state_dict() leaves the workload able to carry on.
    assert run(first, 4) == straight_losses[8:]
    first.close()
    assert first.model is None and first.optimizer is None  # its tensors go back to the pool


def test_state_from_other_params_is_rejected(tmp_path):
    state = make(tmp_path / "a", hidden=8).state_dict()
    other = make(tmp_path / "b", hidden=9)
    with pytest.raises(ValueError, match="shape"):
        other.load_state_dict(state)
    with pytest.raises(ValueError):
        other.load_state_dict(b"not a checkpoint")


def test_the_result_is_the_trained_model_that_keras_loads(tmp_path):
    """Sliced (resumed from a cold checkpoint) or not, the stored model is the same, bitwise."""
    import keras

    params = {"steps": 10, "batch_size": 16, "hidden": 8, "seed": 3}
    straight = make(tmp_path / "a", **params)
    run(straight, 10)
    first = make(tmp_path / "b", **params)
    run(first, 4)
    resumed = make(tmp_path / "c", **params)
    resumed.load_state_dict(first.state_dict())
    run(resumed, 6)

    for name, workload in (("straight", straight), ("sliced", resumed)):
        out = tmp_path / name
        out.mkdir()
        workload.write_result(out)
        assert [p.name for p in out.iterdir()] == ["model.keras"]
        model = keras.models.load_model(out / "model.keras")
        for got, want in zip(model.get_weights(), straight.model.get_weights(), strict=True):
            np.testing.assert_array_equal(got, want)
        x, _y = generated_batch(3, 0, 4)
        np.testing.assert_array_equal(model.predict_on_batch(x), straight.model.predict_on_batch(x))


@pytest.mark.slow  # two Keras trainings on a real worker; CI's slow pass runs it (the bound: test_data_cache.py)
def test_two_jobs_with_new_seeds_do_not_grow_the_hosts_cache_by_two_datasets(start_workers, alice, tmp_path):
    # Given a GPU host whose data cache holds 2 MB: one dataset of 20,000 examples (1.36 MB).
    examples = 20_000
    assert MB < dataset_bytes(examples) <= 2 * MB < 2 * dataset_bytes(examples)
    cache = tmp_path / "cache"
    start_workers(1, CLOCKQ_CACHE_DIR=str(cache), CLOCKQ_CACHE_MB="2", CLOCKQ_PREFETCH_EVERY_S="0")
    # When alice trains twice on a dataset, each time with a new seed,
    params = {"steps": 2, "batch_size": 8, "hidden": 4, "dataset_examples": examples}
    jobs = [submit(alice, "SP", f"seed {seed}", "keras_train", seed=seed, **params) for seed in (101, 102)]
    # then both train, and the cache holds one dataset, not two.
    assert [j.state for j in wait_finished(*jobs, timeout=180)] == ["succeeded", "succeeded"]
    entries = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1 and sum(p.stat().st_size for p in entries) <= 2 * MB, entries
