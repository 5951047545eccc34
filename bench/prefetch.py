"""What prefetch saves: a keras_train job's first slice with its dataset cached, against the same
slice building the dataset itself.

Usage (from the repository root):

    .venv/bin/python bench/prefetch.py [--examples 2000000] [--rounds 5]

The dataset is generated (keras_train's teacher network labels standard-normal inputs). Each
round times `setup()` plus the first training step twice, alternating: cold (an empty cache
folder: the job builds the dataset and caches it) and prefetched (`prefetch()` ran first, as the
GPU host does while the forecast is low). TensorFlow is imported before the first round, so
neither side pays for it. Medians and the ratio, measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "clockq.settings")
django.setup()

from workers.workloads.base import RunContext  # noqa: E402
from workers.workloads.keras_train import KerasTrainWorkload  # noqa: E402


def first_slice_s(params: dict, cache_dir: Path, work_dir: Path) -> tuple[float, bool]:
    t0 = time.perf_counter()
    workload = KerasTrainWorkload(params)
    workload.setup(RunContext(1, 0, work_dir, cache_dir=cache_dir))
    workload.step()
    return time.perf_counter() - t0, workload.data_from_cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import keras  # noqa: F401  - paid once, before timing

    cold, warm = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for r in range(args.rounds):
            params = {"steps": 10, "batch_size": 64, "hidden": 64, "learning_rate": 1e-3, "seed": r}
            params["dataset_examples"] = args.examples
            s, cached = first_slice_s(params, root / f"cold{r}", root / "work")
            assert not cached
            cold.append(s)
            prefetched = root / f"warm{r}"
            KerasTrainWorkload.prefetch(params, prefetched)
            s, cached = first_slice_s(params, prefetched, root / "work")
            assert cached
            warm.append(s)
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"keras_train, {args.examples:,} examples ({args.examples * 17 * 4 / 2**20:.0f} MB), {args.rounds} rounds")
    print(f"  first slice, dataset built by the job : median {c * 1000:7.0f} ms  (max {max(cold) * 1000:.0f})")
    print(f"  first slice, dataset prefetched       : median {w * 1000:7.0f} ms  (max {max(warm) * 1000:.0f})")
    print(f"  prefetched / built                    : {w / c:.2f}")


if __name__ == "__main__":
    main()
