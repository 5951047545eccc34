"""This host in a cluster: its GPUs, its name, the shared checkpoint folder, the beat lock, the
ports it serves and the admin's password."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from clockq.config.paths import VAR_DIR
from clockq.env import env_float, env_int, env_int_list, env_or_file, env_str, host_name_problem, parse_gpus

CLOCKQ_GPUS = parse_gpus(env_str("CLOCKQ_GPUS") or "auto")
# Memory of each simulated GPU in MiB, e.g. "16384,81920"; the last value repeats.
CLOCKQ_SIM_GPU_MEMORY_MIB = env_int_list("CLOCKQ_SIM_GPU_MEMORY_MIB", [16384], min_value=1, max_value=4 * 2**20)
_checkpoint_dir = env_or_file("CLOCKQ_CHECKPOINT_DIR")
if _checkpoint_dir is not None and not os.path.isabs(_checkpoint_dir):
    raise ImproperlyConfigured(
        f"CLOCKQ_CHECKPOINT_DIR={_checkpoint_dir!r} is not an absolute path; with several hosts it is the "
        "shared folder's mount point, the same on every host"
    )
CLOCKQ_CHECKPOINT_DIR = Path(_checkpoint_dir or VAR_DIR / "checkpoints")
# This host's name in the cluster: its workers are gpu<N>@<CLOCKQ_HOST>, control@<CLOCKQ_HOST>, ...
# Two hosts must not share one (a worker refuses to start while a live one holds its name).
CLOCKQ_HOST = (env_str("CLOCKQ_HOST") or "").strip() or socket.gethostname()
if _problem := host_name_problem(CLOCKQ_HOST):
    raise ImproperlyConfigured(f"CLOCKQ_HOST={CLOCKQ_HOST!r}: {_problem}")
# Exactly one beat sends the periodic tasks: it holds a lock in Redis for this long and renews
# it at each tick; a second beat waits, and takes over within this time when the first dies.
CLOCKQ_BEAT_LOCK_S = env_float("CLOCKQ_BEAT_LOCK_S", 15.0, min_value=2.0, max_value=600.0)
PORT = env_int("PORT", 8000, min_value=1, max_value=65535)
FLOWER_PORT = env_int("FLOWER_PORT", 5555, min_value=1, max_value=65535)
CLOCKQ_ADMIN_PASSWORD = env_or_file("CLOCKQ_ADMIN_PASSWORD")
