"""The GPU worker's slices: retries, checkpoints, the RT lane, leases, slice lengths, the service
ladder, snapshots, warm resume and telemetry sampling."""

from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from clockq.config.paths import VAR_DIR
from clockq.env import env_choice, env_float, env_float_list, env_int, env_str
from clockq.policy import affinity as _affinity
from clockq.policy.ordering import BASE_LADDER_GPU_S, Ladder

# A workload that raises is rolled back to its last checkpoint and retried this many times.
CLOCKQ_MAX_RETRIES = env_int("CLOCKQ_MAX_RETRIES", 3, min_value=0, max_value=100)
# A job that keeps running in continued slices still checkpoints this often, so a crash or a
# failing step loses at most this much work.
CLOCKQ_CHECKPOINT_EVERY_S = env_float("CLOCKQ_CHECKPOINT_EVERY_S", 60.0, min_value=0.0, max_value=86400.0)
# A queued job whose message has been missing from the broker this long is dispatched again.
CLOCKQ_REDISPATCH_GRACE_S = env_float("CLOCKQ_REDISPATCH_GRACE_S", 10.0, min_value=0.0, max_value=3600.0)
CLOCKQ_RT_LANE = env_choice("CLOCKQ_RT_LANE", "on", ("on", "off")) == "on"  # workers/rt_lane.py
CLOCKQ_PAUSE_MAX_S = env_float("CLOCKQ_PAUSE_MAX_S", 2.0, min_value=0.05, max_value=3600.0)  # then a checkpoint
# Where each RT lane holds its life lock, an flock its GPU's main worker takes the instant the
# lane dies, to take its RT job back at once (workers/lane_life.py). It must be on this host's
# own disk: var/ is, for the single-host setup; with var/ on a network mount, name a local one.
CLOCKQ_LANE_LOCK_DIR = Path(env_str("CLOCKQ_LANE_LOCK_DIR") or VAR_DIR / "lanes")
# A running job's lease: renewed every quarter of it by its worker; past it, the reaper takes
# the job back. It must outlast a stalled database write, not a step: renewal runs in a thread.
CLOCKQ_LEASE_S = env_float("CLOCKQ_LEASE_S", 20.0, min_value=1.0, max_value=3600.0)
# Slices are never so short that switching costs more than this share of the GPU.
CLOCKQ_OVERHEAD_BUDGET = env_float("CLOCKQ_OVERHEAD_BUDGET", 0.05, min_value=0.0, max_value=1.0)
CLOCKQ_MAX_SLICE_MS = env_int("CLOCKQ_MAX_SLICE_MS", 5000, min_value=1, max_value=3_600_000)
# The service ladder (clockq/policy/ordering.py): the attained GPU-seconds at which a job of the
# least urgent tier drops a level in the order; more urgent tiers stretch it. Increasing.
CLOCKQ_SERVICE_LADDER_S = env_float_list(
    "CLOCKQ_SERVICE_LADDER_S", list(BASE_LADDER_GPU_S), min_value=0.001, max_value=1e12
)
try:
    Ladder(base_gpu_s=tuple(CLOCKQ_SERVICE_LADDER_S))
except ValueError as _exc:
    raise ImproperlyConfigured(f"CLOCKQ_SERVICE_LADDER_S={CLOCKQ_SERVICE_LADDER_S}: {_exc}") from None
# Snapshot, then persist: a checkpoint is copied into host memory (the snapshot) and the GPU goes
# to the next job; a background thread writes it. Snapshots in flight hold at most this much host
# memory per worker; past it, the next checkpoint is written before the GPU is handed over.
CLOCKQ_SNAPSHOT_MEMORY_MB = env_int("CLOCKQ_SNAPSHOT_MEMORY_MB", 1024, min_value=0)
# A worker that claims a job whose newest checkpoint is still being written elsewhere waits this
# long for it, then falls back to the generation before it (the writer died, or is very slow).
CLOCKQ_PERSIST_WAIT_S = env_float("CLOCKQ_PERSIST_WAIT_S", 30.0, min_value=0.0, max_value=3600.0)
# Warm resume: live workloads a worker keeps after yielding them, bounded by count and state size.
CLOCKQ_WARM_CACHE_JOBS = env_int("CLOCKQ_WARM_CACHE_JOBS", 2, min_value=0, max_value=64)
CLOCKQ_WARM_CACHE_MB = env_int("CLOCKQ_WARM_CACHE_MB", 512, min_value=0)
# Placement affinity (clockq/policy/affinity.py): how long a free GPU leaves a job yielded on
# another worker, which holds it warm and is busy, to that worker. 0 turns it off.
CLOCKQ_WARM_WAIT_S = env_float("CLOCKQ_WARM_WAIT_S", _affinity.WARM_WAIT_S, min_value=0.0, max_value=10.0)
# GPU telemetry sampling interval while a slice runs.
CLOCKQ_SAMPLE_EVERY_S = env_float("CLOCKQ_SAMPLE_EVERY_S", 0.01, min_value=0.001, max_value=10.0)
