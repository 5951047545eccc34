"""Storage and quotas: the data cache and prefetch, each user's and each job's share of the
checkpoint store, the room kept free on it, a program's kept logs, and retention."""

from __future__ import annotations

from pathlib import Path

from clockq.config.paths import VAR_DIR
from clockq.env import env_float, env_int, env_str

# Data that workloads prefetch ahead of their jobs (keras_train's datasets), shared by the jobs
# of a host. Prefetching runs in `gpuworkers` every CLOCKQ_PREFETCH_EVERY_S (0: never) while the
# control state has prefetch on, for the next CLOCKQ_PREFETCH_JOBS_PER_GPU queued jobs per GPU.
CLOCKQ_CACHE_DIR = Path(env_str("CLOCKQ_CACHE_DIR") or VAR_DIR / "cache")
# The cache's bounds (workers/data_cache.py): its key space is the users' (a dataset per seed),
# and it lies by default on the disk of the database and the broker's append-only file. It holds
# at most CLOCKQ_CACHE_MB, least recently used entries dropped first: 2 GiB holds seven of the
# largest datasets (4,000,000 examples, 272 MB), a few GPUs' jobs at that size and hundreds at
# common ones (a miss costs a rebuild, at most 8 s of CPU), and is small beside a disk that
# holds a database. It never leaves its disk with less than CLOCKQ_CACHE_RESERVE_PERCENT of its size free,
# and gives room back when something else fills the disk: 10 %, twice the checkpoint store's,
# because a Redis AOF rewrite or a SQLite checkpoint writes a second copy on this disk. A
# dataset the cache has no room for is built and kept in memory only. CLOCKQ_CACHE_MB=0: no cache.
CLOCKQ_CACHE_MB = env_int("CLOCKQ_CACHE_MB", 2048, min_value=0)
CLOCKQ_CACHE_RESERVE_PERCENT = env_float("CLOCKQ_CACHE_RESERVE_PERCENT", 10.0, min_value=0.0, max_value=90.0)
CLOCKQ_PREFETCH_EVERY_S = env_int("CLOCKQ_PREFETCH_EVERY_S", 30, min_value=0, max_value=3600)
CLOCKQ_PREFETCH_JOBS_PER_GPU = env_int("CLOCKQ_PREFETCH_JOBS_PER_GPU", 2, min_value=1, max_value=100)
# Per-user limits, unless the admin sets other ones for a user (Quotas): jobs queued, running or
# held at once, and checkpoint storage (what finished jobs keep counts until retention ends).
CLOCKQ_QUOTA_ACTIVE_JOBS = env_int("CLOCKQ_QUOTA_ACTIVE_JOBS", 500, min_value=1)
CLOCKQ_QUOTA_CHECKPOINT_MB = env_int("CLOCKQ_QUOTA_CHECKPOINT_MB", 20 * 1024, min_value=1)
# Files (inodes) a user's jobs may hold in their work folders at once: a store's inodes run out
# long before its bytes do when a program makes small files (300,000 of them fill a 1 GiB tmpfs).
CLOCKQ_QUOTA_FILES = env_int("CLOCKQ_QUOTA_FILES", 1_000_000, min_value=1)
# What one job may hold on the checkpoint store (its checkpoints, its work folder, logs included,
# and its result), whatever its owner's quota leaves: one job of a user cannot take all of it.
CLOCKQ_JOB_STORAGE_MB = env_int("CLOCKQ_JOB_STORAGE_MB", 10 * 1024, min_value=1)
CLOCKQ_JOB_FILES = env_int("CLOCKQ_JOB_FILES", 100_000, min_value=1)
# Room on the checkpoint store that no job's work folder may take: the checkpoints and results of
# every other job are written there, so a store one job fills stalls every GPU. A share of the
# store's size, so that it means the same on a 1 GiB tmpfs and on a 10 TB volume.
CLOCKQ_STORE_RESERVE_PERCENT = env_float("CLOCKQ_STORE_RESERVE_PERCENT", 5.0, min_value=0.0, max_value=90.0)
# A storage fault that follows one job from claim to claim, while the store takes other writes
# (a small synced probe right after the fault), is the job's after this many: the job fails.
CLOCKQ_JOB_STORAGE_FAULTS = env_int("CLOCKQ_JOB_STORAGE_FAULTS", 3, min_value=1, max_value=100)
# How much of a command program's stdout and of its stderr the worker keeps (the end of each),
# in the work folder's stdout.log and stderr.log: a program's output goes through the worker,
# never straight to a file on the store.
CLOCKQ_COMMAND_LOG_KEEP_KB = env_int("CLOCKQ_COMMAND_LOG_KEEP_KB", 2048, min_value=4, max_value=1024 * 1024)
# Checkpoints of finished jobs are deleted this long after they finish.
CLOCKQ_CHECKPOINT_RETENTION_S = env_int("CLOCKQ_CHECKPOINT_RETENTION_S", 86_400, min_value=0)
# Results (what a succeeded job produced) are deleted this long after the job finished; 0 keeps
# them until someone deletes the job's folder. They count toward the owner's storage quota.
CLOCKQ_RESULT_RETENTION_S = env_int("CLOCKQ_RESULT_RETENTION_S", 0, min_value=0)
