"""A command program's memory limit, enforced in a way that works with CUDA.

RLIMIT_AS bounds address space, not memory, and CUDA reserves far more address space than it
uses, so a program's limit is held by one of:

- **A cgroup of its own** (workers/memory_cgroup.py) where the host has a writable memory cgroup:
  the kernel refuses the program's pages past the limit, swap included, and its OOM killer,
  confined to the cgroup, kills there and never in the worker, which stays outside. The
  sandbox's first process is moved in while bwrap holds it at its --block-fd, before it forks the
  program: every process of the program is in the cgroup from its first instruction.
- **The watchdog** elsewhere (a container with read-only cgroups, a program without a sandbox,
  or CLOCKQ_COMMAND_MEMORY_ENFORCE=watchdog): a thread of the worker sums, every
  CLOCKQ_COMMAND_MEMORY_WATCH_MS, the anonymous, shared and swapped memory of the program's
  processes (every process below the sandbox's first one; without a sandbox, every process of
  its uid) and what its private tmpfs mounts (/tmp, /dev/shm, ...) hold, and kills the sandbox
  past the limit. It can be passed by what a program allocates between two looks, and counts
  pages shared after a fork once a process.

Either way a thread of the worker watches, kills the whole sandbox when the limit is passed (an
OOM kill in a v1 cgroup takes one process), and keeps the reason, which names the limit: the job
fails with it (MemoryLimitExceeded), and is not retried, as a program that passed its limit once
passes it again.

The limit is CLOCKQ_COMMAND_MEMORY_MB, or by default this host's share per GPU
(`share_per_gpu_mb`): a program gets what a GPU's part of the host is, as on a cloud GPU
instance, and the host keeps what its system and clockq's own processes need.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from workers import gpus
from workers.memory_cgroup import CgroupParent, CgroupUnavailable, ProgramCgroup, find_parent, own_limit_files
from workers.workloads.base import JobRefused

log = logging.getLogger("clockq.sandbox")

MB = 2**20
# A GPU worker's own processes: its Celery worker and its RT lane, each a parent and a child of
# 105-125 MB resident (Django, Celery), 465 MB in all as measured with simulated GPUs; 600 leaves
# room for NVML and CUDA's host-side state. A Keras job's model counts in the snapshot and warm
# cache budgets, added to it.
WORKER_PROCESSES_MB = 600
MIN_SHARE_MB = 1024  # below this a host is too small to share: each program gets this much


class MemoryLimitExceeded(JobRefused):
    """The program used more memory than its limit and was killed: the job fails at once, with
    the limit named (a retry would pass it again)."""


class Enforcement(enum.Enum):
    CGROUP = "a cgroup of its own"
    WATCHDOG = "the worker's watchdog"
    NONE = "none"


@dataclass(frozen=True)
class MemoryPolicy:
    """How much memory each program of this worker may use, and how that is held."""

    limit_mb: int  # 0: no limit
    source: str  # where the limit comes from, as the job's reason names it
    enforcement: Enforcement
    cgroup: CgroupParent | None = None
    watch_s: float = 0.1
    note: str = ""  # why the watchdog holds it, where a cgroup cannot

    @property
    def limit_bytes(self) -> int:
        return self.limit_mb * MB

    def over_reason(self, detail: str = "") -> str:
        return f"the program used more than its memory limit of {self.limit_mb:,} MB ({self.source}){detail}; killed"

    def describe(self) -> str:
        if self.enforcement is Enforcement.NONE:
            return "memory unlimited (CLOCKQ_COMMAND_MEMORY_MB=0, unsafe)"
        how = self.enforcement.value
        if self.cgroup is not None:
            how += f" ({self.cgroup.version.value}, in {self.cgroup.path})"
        elif self.note:
            how += f" ({self.note})"
        return f"memory limit {self.limit_mb:,} MB ({self.source}), held by {how}"


def memory_policy(*, sandboxed: bool) -> MemoryPolicy:
    """This worker's memory policy, as the settings and the host say; JobRefused where the
    operator asked for a cgroup (CLOCKQ_COMMAND_MEMORY_ENFORCE=cgroup) and none can be made."""
    limit_mb, source = configured_limit_mb()
    watch_s = settings.CLOCKQ_COMMAND_MEMORY_WATCH_MS / 1000
    if limit_mb == 0:
        return MemoryPolicy(0, source, Enforcement.NONE)
    enforce = settings.CLOCKQ_COMMAND_MEMORY_ENFORCE
    if enforce == "watchdog":
        return MemoryPolicy(limit_mb, source, Enforcement.WATCHDOG, watch_s=watch_s, note="as set")
    if not sandboxed:
        # Without bwrap nothing holds the program before its first instruction: it cannot be moved
        # into a cgroup before it runs.
        note = "no sandbox to hold a program in a cgroup"
        return MemoryPolicy(limit_mb, source, Enforcement.WATCHDOG, watch_s=watch_s, note=note)
    try:
        parent = _cgroup_parent(settings.CLOCKQ_COMMAND_CGROUP)
    except CgroupUnavailable as exc:
        if enforce == "cgroup":
            raise JobRefused(
                f"CLOCKQ_COMMAND_MEMORY_ENFORCE=cgroup, but {exc}; set CLOCKQ_COMMAND_CGROUP, or "
                "CLOCKQ_COMMAND_MEMORY_ENFORCE=auto to hold programs with the watchdog where no cgroup can be made"
            ) from None
        return MemoryPolicy(limit_mb, source, Enforcement.WATCHDOG, watch_s=watch_s, note=str(exc))
    return MemoryPolicy(limit_mb, source, Enforcement.CGROUP, cgroup=parent, watch_s=watch_s)


def configured_limit_mb() -> tuple[int, str]:
    """(limit in MB, its source): CLOCKQ_COMMAND_MEMORY_MB where set, else this host's share per GPU."""
    if settings.CLOCKQ_COMMAND_MEMORY_MB is not None:
        return settings.CLOCKQ_COMMAND_MEMORY_MB, "CLOCKQ_COMMAND_MEMORY_MB"
    per_worker = WORKER_PROCESSES_MB + settings.CLOCKQ_SNAPSHOT_MEMORY_MB + settings.CLOCKQ_WARM_CACHE_MB
    share = share_per_gpu_mb(
        host_memory_mb(),
        host_gpu_count(),
        reserve_mb=settings.CLOCKQ_COMMAND_MEMORY_RESERVE_MB,
        per_worker_mb=per_worker,
    )
    return share, "this host's share per GPU; CLOCKQ_COMMAND_MEMORY_MB sets it"


def share_per_gpu_mb(total_mb: int, gpu_count: int, *, reserve_mb: int, per_worker_mb: int) -> int:
    """What each GPU's program may use: the host's memory less what the system and clockq's roles
    keep (`reserve_mb`) and each GPU's worker holds (`per_worker_mb`), split evenly; at least
    MIN_SHARE_MB."""
    count = max(gpu_count, 1)
    return max((total_mb - reserve_mb - count * per_worker_mb) // count, MIN_SHARE_MB)


def host_memory_mb() -> int:
    """The memory this host gives clockq: MemTotal, or less where the worker's own cgroup is
    limited (a container)."""
    total = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
    for limit_file in own_limit_files():
        with contextlib.suppress(OSError, ValueError):
            raw = limit_file.read_text().strip()
            if raw != "max" and 0 < int(raw) < total:
                total = int(raw)
    return total // MB


@functools.cache
def host_gpu_count() -> int:
    """How many GPUs this host's workers serve (CLOCKQ_GPUS: simulated ones count)."""
    return len(gpus.discover(settings.CLOCKQ_GPUS, settings.CLOCKQ_SIM_GPU_MEMORY_MIB))


@functools.lru_cache(maxsize=4)
def _cgroup_parent(setting: str) -> CgroupParent:
    return find_parent(setting)


# -- the watchdog's measure --------------------------------------------------------------------


@dataclass(frozen=True)
class ProgramProcesses:
    """How the watchdog finds a program's processes, and where it sees its tmpfs mounts."""

    tree: int | None = None  # in a sandbox: its first process, whose descendants are all of its processes
    uid: int | None = None  # else, a uid of its own (a root worker): every process of that uid
    session: int | None = None  # else: its session
    tmpfs: tuple[str, ...] = ()  # its tmpfs mounts, as seen from the host (/proc/PID/root/tmp)

    def pids(self) -> list[str]:
        if self.tree is not None:
            return _descendants(str(self.tree))
        return [pid for pid in os.listdir("/proc") if pid.isdigit() and self._holds(pid)]

    def _holds(self, pid: str) -> bool:
        try:
            if self.uid is not None:
                return _status(pid).get("Uid", "").split()[:1] == [str(self.uid)]
            if self.session is not None:
                return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3]) == self.session
        except (OSError, ValueError, IndexError):
            pass
        return False


COUNTED = ("RssAnon", "RssShmem", "VmSwap")  # file-backed pages are the page cache's: reclaimable


def program_memory_bytes(processes: ProgramProcesses) -> int:
    """The memory the program holds now: its processes' anonymous, shared and swapped pages, and
    what its tmpfs mounts hold."""
    total = 0
    for pid in processes.pids():
        with contextlib.suppress(OSError, ValueError, IndexError):
            status = _status(pid)
            total += sum(int(status[name].split()[0]) * 1024 for name in COUNTED if name in status)
    for mount in processes.tmpfs:
        with contextlib.suppress(OSError):
            fs = os.statvfs(mount)
            total += (fs.f_blocks - fs.f_bfree) * fs.f_frsize
    return total


def _status(pid: str) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.split(":", 1) for line in f if ":" in line)


def _descendants(root: str) -> list[str]:
    """`root` and every process below it. In a PID namespace every process descends from its
    first one (orphans are reparented to it, or to a subreaper below it), so a walk of the tree
    finds them all, at a few reads a process where a scan of /proc reads every process's status
    (20 ms for 330 processes)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo += f.read().split()
    return found


# -- one running program -----------------------------------------------------------------------


class MemoryBound:
    """One running program held to its memory limit, by its cgroup or by the watchdog's measure,
    watched from a thread that kills the program (`kill`) when it passes; `verdict` is the reason
    then, '' otherwise."""

    def __init__(
        self,
        policy: MemoryPolicy,
        kill: Callable[[], None],
        *,
        cgroup: ProgramCgroup | None = None,
        processes: ProgramProcesses | None = None,
    ):
        self.policy = policy
        self.cgroup = cgroup
        self.processes = processes
        self._kill = kill
        self._verdict = ""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="memory-watch", daemon=True)

    @classmethod
    def in_cgroup(cls, policy: MemoryPolicy, name: str, pid: int, kill: Callable[[], None]) -> MemoryBound:
        """A cgroup `name` for the program whose sandbox's first process, held before it forks
        the program, is `pid`; moved in there. OSError where that fails (nothing is left)."""
        assert policy.cgroup is not None
        cgroup = ProgramCgroup.make(policy.cgroup, name, policy.limit_bytes)
        try:
            cgroup.join(pid)
        except OSError:
            cgroup.remove()
            raise
        return cls(policy, kill, cgroup=cgroup)

    def start(self) -> MemoryBound:
        self._thread.start()
        return self

    @property
    def verdict(self) -> str:
        if not self._verdict and self.cgroup is not None and self.cgroup.oom_kills():
            self._verdict = self.policy.over_reason()
        return self._verdict

    def stop(self) -> None:
        """No more looks (the program is ending); the verdict stays."""
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def close(self) -> None:
        """Once the program's processes are gone: the verdict read a last time, the cgroup removed."""
        self.stop()
        if self.cgroup is not None:
            _ = self.verdict
            self.cgroup.remove()
            self.cgroup = None

    def _watch(self) -> None:
        while not self._stopped.wait(self.policy.watch_s):
            if reason := self._over():
                self._verdict = reason
                log.warning("stopping a program: %s", reason)
                self._kill()
                return

    def _over(self) -> str:
        if self.cgroup is not None:
            return self.policy.over_reason() if self.cgroup.oom_kills() else ""
        assert self.processes is not None
        used = program_memory_bytes(self.processes)
        if used <= self.policy.limit_bytes:
            return ""
        return self.policy.over_reason(f": it held {used / MB:,.0f} MB")


def watched_processes(
    *, uid: int | None, namespace_pid: int | None, session: int | None, tmpfs: Sequence[str]
) -> ProgramProcesses:
    """What the watchdog measures for a program: in a sandbox, the processes below its first one
    (`namespace_pid`) and its tmpfs mounts, seen through its root; without one, the processes of
    `uid` where it has one of its own, else of its `session`."""
    if namespace_pid is not None:
        mounts = tuple(f"/proc/{namespace_pid}/root{path}" for path in tmpfs)
        return ProgramProcesses(tree=namespace_pid, tmpfs=mounts)
    return ProgramProcesses(uid=uid, session=None if uid is not None else session)
