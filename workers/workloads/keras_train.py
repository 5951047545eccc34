"""A real Keras 3 training run on generated data.

The data is a generated regression problem: a fixed random "teacher" network, drawn from the
`seed` param, labels standard-normal inputs. Each batch is drawn from a generator seeded by
(seed, step index), so a run resumed from a checkpoint sees exactly the batches an
uninterrupted run would. With `dataset_examples` the job trains instead on a fixed dataset of
that many generated examples (batches drawn from it by the same (seed, step) rule). The dataset
is built once per host into CLOCKQ_CACHE_DIR, or prefetched there while the cluster is quiet
(`prefetch`), so a job whose dataset is already cached skips building it. The cache is bounded
(workers/data_cache.py); a dataset it has no room for is built and kept in memory only.

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
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from workers.data_cache import CacheBounds, DataCache, Stored
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
#
# The cache is keyed by (seed, examples): both decide the dataset's content, and its costly part,
# the labels of the seed's teacher, is what the cache saves (about 7 of the 8 s it takes to build
# 4,000,000 examples), so a key without the seed would save little. What bounds the cache is
# workers/data_cache.py: CLOCKQ_CACHE_MB in all, least recently used entries dropped first.

_DATASET_VERSION = 1
_DATASET_STREAM = 0xDA7A  # a separate random stream from the per-step batches
_LABEL_CHUNK = 65_536  # examples labelled at a time: the float64 temporaries stay ~16 MB


def dataset_name(seed: int, examples: int) -> str:
    return f"keras_train-v{_DATASET_VERSION}-seed{seed}-n{examples}.npz"


def dataset_path(cache_dir: Path, seed: int, examples: int) -> Path:
    return cache_dir / dataset_name(seed, examples)


def dataset_bytes(examples: int) -> int:
    """The most an uncompressed .npz of the dataset takes: its arrays and a margin for the
    headers (490 bytes at 4,000,000 examples)."""
    return examples * (FEATURES + 1) * 4 + 64 * 1024


def build_dataset(seed: int, examples: int) -> tuple[np.ndarray, np.ndarray]:
    """`examples` generated examples labelled by the seed's teacher: the same for every host.
    Labelled in chunks, bit for bit as one pass would, so that building the largest dataset
    takes its 272 MB and little more, not the 2.2 GB a single pass's temporaries took."""
    w1, w2 = _teacher(seed)
    rng = np.random.default_rng((seed, _DATASET_STREAM))
    x = rng.standard_normal((examples, FEATURES), dtype=np.float32)
    noise = rng.standard_normal((examples, 1))
    y = np.empty((examples, 1), dtype=np.float32)
    for i in range(0, examples, _LABEL_CHUNK):
        part = slice(i, i + _LABEL_CHUNK)
        y[part] = np.tanh(x[part] @ w1) @ w2 + _NOISE * noise[part]
    return x, y


def load_or_build_dataset(
    cache_dir: Path | None, seed: int, examples: int, bounds: CacheBounds | None = None
) -> tuple[np.ndarray, np.ndarray, bool]:
    """The dataset from the host's cache if it is there and sound, else built (and cached if
    the cache has room for it). Returns (x, y, found in the cache). A cache that cannot be
    read, written or make room is no fault of the job: the dataset is rebuilt, or kept in
    memory only. `bounds`: the cache's, from settings unless given."""
    if cache_dir is None:
        return (*build_dataset(seed, examples), False)
    cache = DataCache(cache_dir, bounds or CacheBounds.from_settings())
    name = dataset_name(seed, examples)
    found = _read_cached(cache, name, examples)
    if found is not None:
        return (*found, True)
    x, y = build_dataset(seed, examples)
    stored = cache.put(name, dataset_bytes(examples), _npz(x, y))
    if not stored.kept:
        log.warning("keras_train: the dataset %s is not cached: %s; the job keeps it in memory", name, stored.value)
    return x, y, False


def _npz(x: np.ndarray, y: np.ndarray) -> Callable[[BinaryIO], None]:
    return lambda f: np.savez(f, x=x, y=y)


def _read_cached(cache: DataCache, name: str, examples: int) -> tuple[np.ndarray, np.ndarray] | None:
    try:
        f = cache.open_entry(name)
    except OSError as exc:
        log.warning("keras_train: cached dataset %s unreadable (%s); rebuilding it", name, exc)
        return None
    if f is None:
        return None
    # Read through the descriptor opened above: evicted meanwhile, the entry stays readable.
    with f:
        try:
            with np.load(f, allow_pickle=False) as data:
                x, y = data["x"], data["y"]
            if x.shape == (examples, FEATURES) and y.shape == (examples, 1):
                return x, y
            log.warning("keras_train: cached dataset %s has the wrong shape; rebuilding it", name)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            log.warning("keras_train: cached dataset %s unreadable (%s); rebuilding it", name, exc)
    return None


class KerasTrainWorkload(Workload):
    name = "keras_train"

    @classmethod
    def prefetch(cls, params: dict[str, Any], cache_dir: Path) -> bool:
        examples = params.get("dataset_examples", 0)
        if not examples:
            return False
        seed, cache = params["seed"], DataCache(cache_dir, CacheBounds.from_settings())
        if cache.touch(dataset_name(seed, examples)):
            return False  # there already, and now the most recently used: its job is next
        # A prefetch takes only free room. Were it to evict, the datasets of more queued jobs
        # than the cache holds would push each other out and be built again at every pass.
        if cache.refusal(dataset_bytes(examples), evict=False) is not None:
            return False
        x, y = build_dataset(seed, examples)
        stored = cache.put(dataset_name(seed, examples), dataset_bytes(examples), _npz(x, y), evict=False)
        return stored is Stored.WRITTEN

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
