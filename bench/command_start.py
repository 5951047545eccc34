"""What a command program's memory cgroup and own network add to its start and its end.

Usage (from the repository root, as root, where bwrap and slirp4netns are installed):

    .venv/bin/python bench/command_start.py [--starts 20]

Each configuration starts `/bin/sleep` as job 7's program `--starts` times through the worker's
own code (CommandWorkload: uid lease, bwrap, the --block-fd gate, cgroup, slirp4netns), in turn,
so that a machine whose speed drifts meets them alike. `start` is ready() up to the program's
own process being known (the SIGUSR1-handler wait is set to 0: sleep installs none); `end` is
close(), which kills the sandbox and waits for all of it, slirp4netns included, to be gone.

- `host, no limit`: the sandbox as before: the host's network, no memory bound (the gate is
  released at once).
- `host, cgroup`: plus the program's memory cgroup.
- `none, cgroup`: plus a network namespace of its own, loopback only.
- `private, cgroup`: the default: plus slirp4netns.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {
    "host, no limit": {"CLOCKQ_COMMAND_NETWORK": "host", "CLOCKQ_COMMAND_MEMORY_MB": 0},
    "host, cgroup": {"CLOCKQ_COMMAND_NETWORK": "host", "CLOCKQ_COMMAND_MEMORY_MB": 1024},
    "none, cgroup": {"CLOCKQ_COMMAND_NETWORK": "none", "CLOCKQ_COMMAND_MEMORY_MB": 1024},
    "private, cgroup": {"CLOCKQ_COMMAND_NETWORK": "private", "CLOCKQ_COMMAND_MEMORY_MB": 1024},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: programs get uids of their own only under a root worker")
    store = Path(tempfile.mkdtemp(prefix="clockq-bench-"))
    store.chmod(0o711)
    os.environ.update(
        DJANGO_SETTINGS_MODULE="clockq.settings",
        CLOCKQ_CHECKPOINT_DIR=str(store / "checkpoints"),
        CLOCKQ_COMMAND_MEMORY_ENFORCE="cgroup",
    )
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings

    from clockq.jobs import workloads
    from workers.workloads import command

    command.HANDLER_WAIT_S = 0.0
    params = workloads.validate("command", {"argv": ["/bin/sleep", "60"], "step_ms": 5.0}, may_run_commands=True)
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in CONFIGS}
    try:
        for _ in range(args.starts):
            for name, config in CONFIGS.items():
                for key, value in config.items():
                    setattr(settings, key, value)
                workload = command.CommandWorkload(params)
                workload.setup(command.RunContext(7, 0, store / "checkpoints" / "7" / "work"))
                began = time.perf_counter()
                workload.ready()
                started = time.perf_counter()
                workload.close()
                ended = time.perf_counter()
                times[name][0].append((started - began) * 1000)
                times[name][1].append((ended - started) * 1000)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    base_start, base_end = (statistics.median(t) for t in times["host, no limit"])
    print(f"{args.starts} starts each; medians in ms")
    print(f"{'configuration':<18} {'start':>7} {'+start':>7} {'end':>7} {'+end':>7}")
    for name, (starts, ends) in times.items():
        start, end = statistics.median(starts), statistics.median(ends)
        print(f"{name:<18} {start:7.1f} {start - base_start:+7.1f} {end:7.1f} {end - base_end:+7.1f}")


if __name__ == "__main__":
    main()
