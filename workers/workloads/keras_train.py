"""A real Keras 3 training run on generated data.

The data is a generated regression problem: a fixed random "teacher" network, drawn from the
`seed` param, labels standard-normal inputs. Each batch is drawn from a generator seeded by
(seed, step index), so a run resumed from a checkpoint sees exactly the batches an
uninterrupted run would. With `dataset_examples` the job trains instead on a fixed dataset of
that many generated examples (batches drawn from it by the same (seed, step) rule). The dataset
is built once per host into CLOCKQ_CACHE_DIR, or prefetched there while the cluster is quiet
(`prefetch`), so a job whose dataset is already cached skips building it.

Keras runs on TensorFlow, clockq's default backend. `KERAS_BACKEND=torch` (or `jax`) runs it on
that framework instead, on a host that has it; the checkpoint format does not change. Keras and
TensorFlow are imported lazily, inside `setup()`, so importing this module (for the registry or
a web process) stays cheap. This is the only workload that imports them.
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from workers.workloads.base import RunContext, Workload

FEATURES = 16  # inputs per generated example
_TEACHER_HIDDEN = 32
_NOISE = 0.01
_FORMAT_VERSION = 1

log = logging.getLogger("clockq.workloads")


def _teacher(seed: int) -> tuple[np.ndarray, np.ndarray]:
    teacher = np.random.default_rng(seed)
    w1 = teacher.standard_normal((FEATURES, _TEACHER_HIDDEN)) / np.sqrt(FEATURES)
    w2 = teacher.standard_normal((_TEACHER_HIDDEN, 1)) / np.sqrt(_TEACHER_HIDDEN)
    return w1, w2


def generated_batch(seed: int, step_index: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Batch number `step_index` of the generated data for `seed`: (x, y) as float32 arrays."""
    w1, w2 = _teacher(seed)
    rng = np.random.default_rng((seed, step_index))
    x = rng.standard_normal((batch_size, FEATURES))
    y = np.tanh(x @ w1) @ w2 + _NOISE * rng.standard_normal((batch_size, 1))
    return x.astype(np.float32), y.astype(np.float32)


# --- a fixed dataset, built once per host and cached (what prefetch fills) --------------------

_DATASET_VERSION = 1
_DATASET_STREAM = 0xDA7A  # a separate random stream from the per-step batches


def dataset_path(cache_dir: Path, seed: int, examples: int) -> Path:
    return cache_dir / f"keras_train-v{_DATASET_VERSION}-seed{seed}-n{examples}.npz"


def build_dataset(seed: int, examples: int) -> tuple[np.ndarray, np.ndarray]:
    """`examples` generated examples labelled by the seed's teacher: the same for every host."""
    w1, w2 = _teacher(seed)
    rng = np.random.default_rng((seed, _DATASET_STREAM))
    x = rng.standard_normal((examples, FEATURES), dtype=np.float32)
    y = (np.tanh(x @ w1) @ w2 + _NOISE * rng.standard_normal((examples, 1))).astype(np.float32)
    return x, y


def load_or_build_dataset(cache_dir: Path | None, seed: int, examples: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """The dataset from the host's cache if it is there and sound, else built (and cached).
    Returns (x, y, found in the cache). A cache that cannot be read or written is no fault of
    the job: it is rebuilt, or simply not kept."""
    path = dataset_path(cache_dir, seed, examples) if cache_dir else None
    if path is not None and path.exists():
        try:
            with np.load(path, allow_pickle=False) as data:
                x, y = data["x"], data["y"]
            if x.shape == (examples, FEATURES) and y.shape == (examples, 1):
                return x, y, True
            log.warning("keras_train: cached dataset %s has the wrong shape; rebuilding it", path.name)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("keras_train: cached dataset %s unreadable (%s); rebuilding it", path.name, exc)
    x, y = build_dataset(seed, examples)
    if path is not None:
        _store(path, x, y)
    return x, y, False


def _store(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    """Write the dataset next to its final name and rename it into place: jobs on the other GPUs
    of the host never see half a file, and two that build it at once both end with a whole one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".building-", suffix=".npz")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, x=x, y=y)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        log.warning("keras_train: could not cache the dataset %s: %s", path.name, exc)


class KerasTrainWorkload(Workload):
    name = "keras_train"

    @classmethod
    def prefetch(cls, params: dict[str, Any], cache_dir: Path) -> bool:
        examples = params.get("dataset_examples", 0)
        if not examples or dataset_path(cache_dir, params["seed"], examples).exists():
            return False
        load_or_build_dataset(cache_dir, params["seed"], examples)
        return True

    def setup(self, ctx: RunContext) -> None:
        # The dataset first: it needs no TensorFlow, and how long it took is worth knowing.
        self.data: tuple[np.ndarray, np.ndarray] | None = None
        self.data_from_cache = False
        if examples := self.params.get("dataset_examples", 0):
            x, y, self.data_from_cache = load_or_build_dataset(ctx.cache_dir, self.params["seed"], examples)
            self.data = (x, y)
        if os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            import tensorflow as tf

            # Take GPU memory as needed rather than all of it up front. This fails harmlessly
            # once TensorFlow has already initialised its devices in this process.
            for gpu in tf.config.list_physical_devices("GPU"):
                with contextlib.suppress(RuntimeError):
                    tf.config.experimental.set_memory_growth(gpu, True)

        import keras

        seed, hidden = self.params["seed"], self.params["hidden"]

        def init(offset: int) -> Any:
            return keras.initializers.GlorotUniform(seed=(seed + offset) % 2**31)

        self.model = keras.Sequential(
            [
                keras.Input(shape=(FEATURES,)),
                keras.layers.Dense(hidden, activation="relu", kernel_initializer=init(1), name="hidden1"),
                keras.layers.Dense(hidden, activation="relu", kernel_initializer=init(2), name="hidden2"),
                keras.layers.Dense(1, kernel_initializer=init(3), name="out"),
            ],
            name="keras_train",
        )
        self.optimizer = keras.optimizers.Adam(learning_rate=self.params["learning_rate"])
        self.model.compile(optimizer=self.optimizer, loss="mse", jit_compile=False)
        # Create the optimizer's slots now, so a checkpoint can be restored into them.
        self.optimizer.build(self.model.trainable_variables)
        self.done = 0
        self.last_loss: float | None = None
        self.reported = False

    def step(self) -> float:
        steps = self.params["steps"]
        self.reported = False
        if self.done < steps:
            x, y = self._batch(self.done)
            logs = self.model.train_on_batch(x, y, return_dict=True)
            self.last_loss = float(logs["loss"])
            self.done += 1
            self.reported = True
        return min(self.done / steps, 1.0)

    def _batch(self, step_index: int) -> tuple[np.ndarray, np.ndarray]:
        if self.data is None:
            return generated_batch(self.params["seed"], step_index, self.params["batch_size"])
        x, y = self.data
        # Examples drawn by (seed, step), so a resumed run sees the batches a straight one would.
        picks = np.random.default_rng((self.params["seed"], step_index)).integers(0, len(x), self.params["batch_size"])
        return x[picks], y[picks]

    def metrics(self) -> list[tuple[int, str, float]]:
        # The training loss of the batch just trained, at its step (1-based).
        return [(self.done, "loss", self.last_loss)] if self.reported and self.last_loss is not None else []

    def close(self) -> None:
        """Drop the model, its optimizer and its data, so that their tensors go back to the
        framework's memory pool for the worker's next job. (TensorFlow keeps that pool: its
        memory leaves the GPU only with the process.) Not keras.backend.clear_session(): other
        jobs kept warm in this process share Keras's global state."""
        self.model = self.optimizer = self.data = None
        gc.collect()

    def state_dict(self) -> bytes:
        arrays: dict[str, Any] = {
            "version": np.int64(_FORMAT_VERSION),
            "steps_done": np.int64(self.done),
        }
        for i, w in enumerate(self.model.get_weights()):
            arrays[f"w{i}"] = w
        for i, v in enumerate(self.optimizer.variables):
            arrays[f"opt{i}"] = np.asarray(v.numpy())
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    def load_state_dict(self, state: bytes) -> None:
        weights = self.model.get_weights()
        opt_vars = self.optimizer.variables
        expected = {"version", "steps_done"}
        expected |= {f"w{i}" for i in range(len(weights))} | {f"opt{i}" for i in range(len(opt_vars))}
        with np.load(io.BytesIO(state), allow_pickle=False) as data:
            if set(data.files) != expected:
                raise ValueError("keras_train state does not match this model's params")
            if int(data["version"]) != _FORMAT_VERSION:
                raise ValueError(f"keras_train state has format {int(data['version'])}, expected {_FORMAT_VERSION}")
            new_weights = [data[f"w{i}"] for i in range(len(weights))]
            new_opt = [data[f"opt{i}"] for i in range(len(opt_vars))]
            done = int(data["steps_done"])
        for i, (old, new) in enumerate(zip(weights, new_weights, strict=True)):
            if old.shape != new.shape:
                raise ValueError(f"keras_train state: weight {i} has shape {new.shape}, expected {old.shape}")
        for var, new in zip(opt_vars, new_opt, strict=True):
            if tuple(var.shape) != new.shape:
                raise ValueError(f"keras_train state: optimizer variable {var.name} has shape {new.shape}")
        if not 0 <= done <= self.params["steps"]:
            raise ValueError(f"keras_train state: steps_done {done} out of range")
        self.model.set_weights(new_weights)
        for var, new in zip(opt_vars, new_opt, strict=True):
            var.assign(new)
        self.done = done

    def write_result(self, directory: Path) -> None:
        # The Keras format: keras.models.load_model() gives back the model with its optimizer.
        self.model.save(directory / "model.keras")

    def declared_gpu_util(self) -> float | None:
        return 0.7
