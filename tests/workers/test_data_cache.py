"""The data cache (CLOCKQ_CACHE_DIR) is bounded: a user who asks for a new dataset per seed
cannot fill the disk of the database (issue 38, item 4). The datasets are keras_train's own,
generated, small enough (20,000 examples, 1.36 MB) that a few fill a cache of a few MB."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.harness import wait_for
from workers.data_cache import MB, CacheBounds, DataCache, Stored
from workers.workloads import keras_train

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = 20_000  # 1.36 MB a dataset
DATASET = keras_train.dataset_bytes(EXAMPLES)


def cached_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if not p.name.startswith("."))


def cached_seeds(directory: Path) -> set[int]:
    return {int(p.name.split("-seed")[1].split("-")[0]) for p in directory.glob("keras_train-*.npz")}


def test_a_new_seed_per_job_never_takes_more_than_the_cache_bound(tmp_path, settings):
    # Given a cache of 3 MB: two datasets.
    settings.CLOCKQ_CACHE_MB = 3
    # When a user asks for a dataset with a new seed, again and again,
    for seed in range(10):
        keras_train.load_or_build_dataset(tmp_path, seed, EXAMPLES)
        # Then the cache never holds more than its bound,
        assert cached_bytes(tmp_path) <= 3 * MB, sorted(p.name for p in tmp_path.iterdir())
    # and keeps the newest.
    assert cached_seeds(tmp_path) == {8, 9}
    assert keras_train.load_or_build_dataset(tmp_path, 9, EXAMPLES)[2] is True


def test_the_least_recently_used_dataset_is_dropped_first(tmp_path, settings):
    settings.CLOCKQ_CACHE_MB = 3
    keras_train.load_or_build_dataset(tmp_path, 1, EXAMPLES)
    keras_train.load_or_build_dataset(tmp_path, 2, EXAMPLES)
    # Seed 1 is read again: seed 2 is now the least recently used.
    assert keras_train.load_or_build_dataset(tmp_path, 1, EXAMPLES)[2] is True
    keras_train.load_or_build_dataset(tmp_path, 3, EXAMPLES)
    assert cached_seeds(tmp_path) == {1, 3}


def test_prefetching_a_cached_dataset_makes_it_the_most_recently_used(tmp_path, settings):
    settings.CLOCKQ_CACHE_MB = 3
    params = {"seed": 1, "dataset_examples": EXAMPLES}
    keras_train.load_or_build_dataset(tmp_path, 1, EXAMPLES)
    keras_train.load_or_build_dataset(tmp_path, 2, EXAMPLES)
    assert keras_train.KerasTrainWorkload.prefetch(params, tmp_path) is False  # there already
    keras_train.load_or_build_dataset(tmp_path, 3, EXAMPLES)
    assert cached_seeds(tmp_path) == {1, 3}  # the job it was prefetched for still finds it


def test_a_prefetch_takes_only_free_room_and_drops_no_dataset(tmp_path, settings):
    # More queued jobs than the cache holds would otherwise push each other's datasets out,
    # and have them built again at every prefetch pass.
    settings.CLOCKQ_CACHE_MB = 3
    prefetch = keras_train.KerasTrainWorkload.prefetch
    assert [prefetch({"seed": s, "dataset_examples": EXAMPLES}, tmp_path) for s in (1, 2, 3)] == [True, True, False]
    assert cached_seeds(tmp_path) == {1, 2}
    # A job's own build still makes room: its dataset is needed now.
    assert keras_train.load_or_build_dataset(tmp_path, 3, EXAMPLES)[2] is False
    assert cached_seeds(tmp_path) == {2, 3}


def test_a_dataset_bigger_than_the_whole_cache_is_kept_in_memory_and_says_why(tmp_path, settings, log_records):
    settings.CLOCKQ_CACHE_MB = 1
    logger = keras_train.log
    logger.addHandler(log_records)
    try:
        x, y, cached = keras_train.load_or_build_dataset(tmp_path, 4, EXAMPLES)
    finally:
        logger.removeHandler(log_records)
    want_x, want_y = keras_train.build_dataset(4, EXAMPLES)
    assert not cached and np.array_equal(x, want_x) and np.array_equal(y, want_y)
    assert cached_bytes(tmp_path) == 0
    assert any("not cached: bigger than the whole cache (CLOCKQ_CACHE_MB)" in w for w in log_records.warnings)


def test_the_cache_never_takes_its_disk_below_the_reserve(tiny_filesystem, settings):
    # Given a 2 MiB disk of which the cache must leave half free:
    settings.CLOCKQ_CACHE_MB = 100
    settings.CLOCKQ_CACHE_RESERVE_PERCENT = 50
    vfs = os.statvfs(tiny_filesystem)
    size, reserve = vfs.f_blocks * vfs.f_frsize, vfs.f_blocks * vfs.f_frsize // 2

    def free() -> int:
        vfs = os.statvfs(tiny_filesystem)
        return vfs.f_bavail * vfs.f_frsize

    # a dataset that would leave less than that is not written, and the job still gets it;
    x, _y, cached = keras_train.load_or_build_dataset(tiny_filesystem, 1, EXAMPLES)
    assert not cached and len(x) == EXAMPLES and cached_bytes(tiny_filesystem) == 0
    # smaller ones are, as many as leave the reserve free, the oldest dropped for the newest.
    for seed in range(6):
        keras_train.load_or_build_dataset(tiny_filesystem, seed, 5_000)  # 340 KB
        assert free() >= reserve, f"{free():,} bytes free of {size:,}"
    # Each declares 405,536 bytes (its 340 KB and a margin for headers): two fit above the reserve.
    assert cached_seeds(tiny_filesystem) == {4, 5}


def test_the_cache_gives_room_back_when_something_else_fills_its_disk(tiny_filesystem):
    cache = DataCache(tiny_filesystem, CacheBounds(max_bytes=100 * MB, reserve_percent=25))
    for name in ("a", "b", "c"):
        assert cache.put(name, 300_000, lambda f: f.write(b"\1" * 300_000)) is Stored.WRITTEN
    # Something else (the database, say) takes 1 MB of the 2 MiB disk:
    (tiny_filesystem / ".database").write_bytes(b"\0" * 1_000_000)
    assert cache.trim() == ["a", "b"]  # the oldest first, until a quarter of the disk is free
    vfs = os.statvfs(tiny_filesystem)
    assert vfs.f_bavail >= vfs.f_blocks // 4


def test_an_entry_that_writes_more_than_it_declared_is_discarded(tmp_path):
    cache = DataCache(tmp_path, CacheBounds(max_bytes=10 * MB, reserve_percent=0))
    assert cache.put("liar", 1000, lambda f: f.write(b"\0" * 5000)) is Stored.FAILED
    assert os.listdir(tmp_path) == [".lock"]  # no entry, no temporary file left


def test_an_entry_name_that_is_a_path_is_refused(tmp_path):
    cache = DataCache(tmp_path, CacheBounds(max_bytes=MB, reserve_percent=0))
    for name in ("../escape", "a/b", ".lock", ""):
        with pytest.raises(ValueError, match="not a data cache entry name"):
            cache.put(name, 10, lambda f: f.write(b"x"))


BUILDER = """
import hashlib, sys
from pathlib import Path
from workers.workloads import keras_train
cache_dir, examples = Path(sys.argv[1]), int(sys.argv[2])
for seed in map(int, sys.argv[3:]):
    x, y, _ = keras_train.load_or_build_dataset(cache_dir, seed, examples)
    print(seed, hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest(), flush=True)
"""


def builder(cache_dir: Path, seeds: list[int], cache_mb: int) -> subprocess.Popen:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "clockq.settings", "CLOCKQ_CACHE_MB": str(cache_mb)}
    argv = [sys.executable, "-c", BUILDER, str(cache_dir), str(EXAMPLES), *map(str, seeds)]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)


def test_two_worker_processes_building_datasets_at_once_keep_the_bound_and_whole_entries(tmp_path, settings):
    # Two real processes, as two GPU workers of a host, ask for the same seeds at the same time.
    settings.CLOCKQ_CACHE_MB = 3
    seeds = [0, 1, 2, 3, 0, 1]
    first, second = builder(tmp_path, seeds, 3), builder(tmp_path, seeds, 3)
    outputs = [first.communicate(timeout=120)[0], second.communicate(timeout=120)[0]]
    assert first.returncode == second.returncode == 0
    # Each got the dataset its seed makes, whether it built it or read the other's,
    want = {
        s: hashlib.sha256(b"".join(a.tobytes() for a in keras_train.build_dataset(s, EXAMPLES))).hexdigest()
        for s in set(seeds)
    }
    for out in outputs:
        assert [line.split() for line in out.splitlines()] == [[str(s), want[s]] for s in seeds]
    # the cache holds no more than its bound, every entry in it whole, and no temporary file.
    assert cached_bytes(tmp_path) <= 3 * MB
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".building-")]
    for seed in cached_seeds(tmp_path):
        x, y, cached = keras_train.load_or_build_dataset(tmp_path, seed, EXAMPLES)
        assert cached and hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest() == want[seed]


def blocked_on_lock(pid: int, lock: Path) -> bool:
    """Whether process `pid` waits for a flock on `lock` (a "->" line of /proc/locks)."""
    inode = os.stat(lock).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        waiting = "->" in fields and "FLOCK" in fields and str(pid) in fields
        if waiting and any(f.count(":") == 2 and f.rsplit(":", 1)[1] == str(inode) for f in fields):
            return True
    return False


def test_a_writer_waits_while_another_holds_the_cache(tmp_path, settings):
    # Given a writer of another process in the middle of its write (it holds the cache's lock),
    import fcntl

    settings.CLOCKQ_CACHE_MB = 3
    DataCache(tmp_path, CacheBounds.from_settings()).trim()  # makes the folder and its lock
    lock = tmp_path / ".lock"
    with open(lock, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        # when a worker builds a dataset, it waits to store it: it evicts and writes nothing
        # while the other may be judging the room left.
        other = builder(tmp_path, [5], 3)
        wait_for(lambda: blocked_on_lock(other.pid, lock), 60, what="the builder to wait for the cache's lock")
        assert os.listdir(tmp_path) == [".lock"]
    # Then, once the lock is free, it stores its dataset.
    other.communicate(timeout=60)
    assert other.returncode == 0 and cached_seeds(tmp_path) == {5}


def test_a_reader_keeps_reading_a_dataset_evicted_under_it(tmp_path, settings):
    settings.CLOCKQ_CACHE_MB = 3
    keras_train.load_or_build_dataset(tmp_path, 7, EXAMPLES)
    cache = DataCache(tmp_path, CacheBounds.from_settings())
    # A job has opened seed 7's dataset and not read it yet, when another worker process
    # fills the cache with new seeds, evicting it.
    reading = cache.open_entry(keras_train.dataset_name(7, EXAMPLES))
    other = builder(tmp_path, [8, 9], 3)
    other.communicate(timeout=120)
    assert other.returncode == 0 and cached_seeds(tmp_path) == {8, 9}
    # The job still reads the whole dataset through what it opened.
    with reading, np.load(reading, allow_pickle=False) as data:
        x, y = data["x"], data["y"]
    want_x, want_y = keras_train.build_dataset(7, EXAMPLES)
    assert np.array_equal(x, want_x) and np.array_equal(y, want_y)


def test_building_a_large_dataset_is_bit_for_bit_the_one_pass_it_replaces():
    # The labels are computed in chunks (to bound the build's memory); the dataset a cache
    # built by the one-pass code holds must still be the one a job builds now.
    seed, examples = 5, 3 * 65_536 + 7
    w1, w2 = keras_train._teacher(seed)
    rng = np.random.default_rng((seed, keras_train._DATASET_STREAM))
    x = rng.standard_normal((examples, keras_train.FEATURES), dtype=np.float32)
    y = (np.tanh(x @ w1) @ w2 + keras_train._NOISE * rng.standard_normal((examples, 1))).astype(np.float32)
    got_x, got_y = keras_train.build_dataset(seed, examples)
    assert np.array_equal(got_x, x) and np.array_equal(got_y, y)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("CLOCKQ_CACHE_MB", "-1", "CLOCKQ_CACHE_MB=-1 is below the minimum"),
        ("CLOCKQ_CACHE_RESERVE_PERCENT", "95", "CLOCKQ_CACHE_RESERVE_PERCENT=95.0 is outside"),
    ],
)
def test_a_bad_cache_bound_stops_startup_with_a_clear_error(name, value, message):
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**os.environ, name: value},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr
