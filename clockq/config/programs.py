"""The `command` workload's sandbox and limits, and the registry of workloads a job may name."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from clockq.env import env_bool, env_choice, env_int, env_list, env_str

# The `command` workload runs a user's program in a bubblewrap sandbox (workers/sandbox.py),
# as a uid of its own from this range (workers running as root), with these limits; 0 means no
# limit. CLOCKQ_COMMAND_SANDBOX=none runs programs unsandboxed: unsafe, for a machine whose
# every user is trusted.
CLOCKQ_COMMAND_SANDBOX = env_choice("CLOCKQ_COMMAND_SANDBOX", "bwrap", ("bwrap", "none"))
# A program's network (workers/program_network.py): a namespace of its own, connected outwards by
# slirp4netns with no way to the host's loopback (private, the default: on the host's network a
# job reaches the web server, Flower, Redis and PostgreSQL on 127.0.0.1); none: loopback only;
# host: the host's network (unsafe).
CLOCKQ_COMMAND_NETWORK = env_choice("CLOCKQ_COMMAND_NETWORK", "private", ("private", "none", "host"))
CLOCKQ_COMMAND_UID_BASE = env_int("CLOCKQ_COMMAND_UID_BASE", 1_000_000_000, min_value=1, max_value=2**32 - 2)
CLOCKQ_COMMAND_UID_COUNT = env_int(
    "CLOCKQ_COMMAND_UID_COUNT", 1_000_000_000, min_value=1, max_value=2**32 - 1 - CLOCKQ_COMMAND_UID_BASE
)
# Folders a program may read although they lie in a folder it does not see (/tmp, clockq's code).
CLOCKQ_COMMAND_READ_PATHS = env_list("CLOCKQ_COMMAND_READ_PATHS", [])
for _path in CLOCKQ_COMMAND_READ_PATHS:
    if not os.path.isabs(_path):
        raise ImproperlyConfigured(f"CLOCKQ_COMMAND_READ_PATHS: {_path!r} is not an absolute path")
CLOCKQ_ALLOW_SAME_USER_COMMANDS = env_bool("CLOCKQ_ALLOW_SAME_USER_COMMANDS", False)
CLOCKQ_COMMAND_MAX_PROCESSES = env_int("CLOCKQ_COMMAND_MAX_PROCESSES", 1024, min_value=0, max_value=1_048_576)
CLOCKQ_COMMAND_CPU_S = env_int("CLOCKQ_COMMAND_CPU_S", 7 * 86_400, min_value=0)
# A program's memory, swap included (workers/memory_bound.py). Unset: this host's share per GPU,
# (MemTotal - CLOCKQ_COMMAND_MEMORY_RESERVE_MB - each GPU worker's own) / GPUs, what a GPU's part
# of the host is, as on a cloud GPU instance, so that one job cannot starve the others' programs
# and the workers; 0: no limit (unsafe: one program can take the host's memory).
CLOCKQ_COMMAND_MEMORY_MB = (
    env_int("CLOCKQ_COMMAND_MEMORY_MB", 0, min_value=0) if (env_str("CLOCKQ_COMMAND_MEMORY_MB") or "").strip() else None
)
# Host memory kept out of the shares: the kernel and system services, and clockq's roles that run
# beside the GPU workers on one host (web, beat, control, Flower, Redis, the predictor's
# TensorFlow at about 520 MiB).
CLOCKQ_COMMAND_MEMORY_RESERVE_MB = env_int("CLOCKQ_COMMAND_MEMORY_RESERVE_MB", 4096, min_value=0)
# How the limit is held: a cgroup of the program's own where the host lets the worker make one,
# else the worker's watchdog (auto); cgroup refuses command jobs where no cgroup can be made;
# watchdog never uses one. RLIMIT_AS is never used: CUDA reserves far more address space than it
# uses. CLOCKQ_COMMAND_CGROUP: the folder the programs' cgroups are made in (auto: the worker's
# own memory cgroup on cgroup v1, or its own cgroup v2 where that may have children with memory).
CLOCKQ_COMMAND_MEMORY_ENFORCE = env_choice("CLOCKQ_COMMAND_MEMORY_ENFORCE", "auto", ("auto", "cgroup", "watchdog"))
CLOCKQ_COMMAND_CGROUP = (env_str("CLOCKQ_COMMAND_CGROUP") or "").strip() or "auto"
if CLOCKQ_COMMAND_CGROUP != "auto" and not os.path.isabs(CLOCKQ_COMMAND_CGROUP):
    raise ImproperlyConfigured(f"CLOCKQ_COMMAND_CGROUP={CLOCKQ_COMMAND_CGROUP!r} is neither auto nor an absolute path")
# How often the worker looks at a running program's memory: its cgroup's OOM kills, or the
# watchdog's sum. A look at the cgroup reads one small file; the watchdog's reads the status of the
# sandbox's processes (under 1 ms for a few; without a sandbox, of every process: 20 ms for 330),
# and a program may pass its limit by what it allocates between two looks.
CLOCKQ_COMMAND_MEMORY_WATCH_MS = env_int("CLOCKQ_COMMAND_MEMORY_WATCH_MS", 100, min_value=10, max_value=10_000)
CLOCKQ_COMMAND_MAX_FILES = env_int("CLOCKQ_COMMAND_MAX_FILES", 4096, min_value=0, max_value=1_048_576)
CLOCKQ_COMMAND_MAX_FILE_MB = env_int("CLOCKQ_COMMAND_MAX_FILE_MB", 50 * 1024, min_value=0)

CLOCKQ_WORKLOADS = {
    "synthetic": "workers.workloads.synthetic.SyntheticWorkload",
    "matmul": "workers.workloads.matmul.MatmulWorkload",
    "keras_train": "workers.workloads.keras_train.KerasTrainWorkload",
    "command": "workers.workloads.command.CommandWorkload",
}
