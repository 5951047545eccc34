"""Memory cgroups for command programs: where this host lets a worker make them, and one a program.

A worker makes each running program's cgroup inside a parent it may write:

- **cgroup v1** (a `memory` hierarchy): by default the worker's own memory cgroup. v1 lets a
  cgroup that holds processes have children, and a child's limit only adds to its parents'.
- **cgroup v2**: a folder whose `cgroup.subtree_control` gives its children the memory
  controller. v2 forbids that in a cgroup that holds processes (other than the root), so the
  worker's own cgroup serves only when it is the root; elsewhere (systemd's `Delegate=yes`, a
  container) the operator names one with CLOCKQ_COMMAND_CGROUP.

Where neither is writable (most containers), workers/memory_bound.py falls back to its watchdog.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("clockq.sandbox")

REMOVE_WAIT_S = 2.0  # the sandbox's last processes leave their cgroup as they finish exiting


class CgroupVersion(enum.Enum):
    V1 = "cgroup v1"
    V2 = "cgroup v2"


class CgroupUnavailable(Exception):
    """This worker cannot make memory cgroups for programs; the message says why."""


@dataclass(frozen=True)
class CgroupParent:
    """The folder in which a worker makes its programs' cgroups."""

    path: Path
    version: CgroupVersion


def find_parent(setting: str) -> CgroupParent:
    """The parent for programs' cgroups as CLOCKQ_COMMAND_CGROUP says ("auto" or a folder), tried
    by making a cgroup in it; CgroupUnavailable saying why there is none."""
    parent = _own_parent() if setting == "auto" else _named_parent(Path(setting))
    if parent.version is CgroupVersion.V2:
        _give_children_memory(parent.path)
    probe = parent.path / f"clockq-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        raise CgroupUnavailable(f"cannot make a cgroup in {parent.path}: {exc.strerror or exc}") from None
    return parent


class ProgramCgroup:
    """One running program's memory cgroup: the limit, without swap, and its OOM kills."""

    def __init__(self, path: Path, version: CgroupVersion):
        self.path = path
        self.version = version

    @classmethod
    def make(cls, parent: CgroupParent, name: str, limit_bytes: int) -> ProgramCgroup:
        """A new cgroup `name` in `parent` holding at most `limit_bytes`, swap included."""
        path = parent.path / name
        with contextlib.suppress(FileNotFoundError):
            path.rmdir()  # empty, left by a worker killed while its program ran (a uid is leased host-wide)
        path.mkdir()
        cgroup = cls(path, parent.version)
        try:
            cgroup._limit(limit_bytes)
        except OSError:
            cgroup.remove()
            raise
        return cgroup

    def _limit(self, limit_bytes: int) -> None:
        if self.version is CgroupVersion.V2:
            self._write("memory.max", limit_bytes)
            self._write_if_present("memory.swap.max", 0)  # absent where the kernel has no swap accounting
            self._write("memory.oom.group", 1)  # an OOM kill takes the whole program, not one of its processes
            return
        self._write("memory.limit_in_bytes", limit_bytes)
        # memory+swap: set after the memory limit, which it may never be below.
        if not self._write_if_present("memory.memsw.limit_in_bytes", limit_bytes):
            self._write_if_present("memory.swappiness", 0)  # no swap accounting (swapaccount=0): no swapping

    def join(self, pid: int) -> None:
        """Move process `pid` (and the children it forks from now on) into the cgroup. The kernel
        waits for an RCU grace period to move a process (5-15 ms measured on a v1 hierarchy, in
        which the host's forks wait too): most of what a memory bound adds to a program's start."""
        self._write("cgroup.procs", pid)

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer killed in the cgroup for its limit."""
        name = "memory.events" if self.version is CgroupVersion.V2 else "memory.oom_control"
        try:
            lines = (self.path / name).read_text().splitlines()
        except OSError:
            return 0
        counts = dict(line.split(None, 1) for line in lines if " " in line)
        if "oom_kill" in counts:
            return int(counts["oom_kill"])
        # v1 before Linux 4.13 counts no kills: a failure to charge past memory+swap is the nearest.
        with contextlib.suppress(OSError, ValueError):
            return int((self.path / "memory.memsw.failcnt").read_text())
        return 0

    def remove(self) -> None:
        """Remove the cgroup once its last process has left it (the sandbox is gone by then)."""
        deadline = time.monotonic() + REMOVE_WAIT_S
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    log.warning("could not remove the program's cgroup %s: %s", self.path, exc.strerror or exc)
                    return
                time.sleep(0.002)

    def _write(self, name: str, value: int) -> None:
        with open(self.path / name, "w") as f:
            f.write(str(value))

    def _write_if_present(self, name: str, value: int) -> bool:
        if not (self.path / name).exists():
            return False
        self._write(name, value)
        return True


def _own_parent() -> CgroupParent:
    """The worker's own memory cgroup (v1), or its own cgroup v2 where that may have children
    with memory."""
    own = _own_cgroups()
    for mount_point, root, fstype, options in _cgroup_mounts():
        if fstype == "cgroup" and "memory" in options and "memory" in own:
            return CgroupParent(_inside(mount_point, root, own["memory"]), CgroupVersion.V1)
    for mount_point, root, fstype, _options in _cgroup_mounts():
        if fstype == "cgroup2" and "" in own and "memory" in _read_words(Path(mount_point) / "cgroup.controllers"):
            return CgroupParent(_inside(mount_point, root, own[""]), CgroupVersion.V2)
    raise CgroupUnavailable("this host mounts no cgroup file system with the memory controller")


def own_limit_files() -> list[Path]:
    """The files that hold the worker's own cgroups' memory limits (a container's, say)."""
    own, found = _own_cgroups(), []
    for mount_point, root, fstype, options in _cgroup_mounts():
        if fstype == "cgroup" and "memory" in options and "memory" in own:
            found.append(_inside(mount_point, root, own["memory"]) / "memory.limit_in_bytes")
        elif fstype == "cgroup2" and "" in own:
            found.append(_inside(mount_point, root, own[""]) / "memory.max")
    return found


def _named_parent(path: Path) -> CgroupParent:
    if (path / "cgroup.controllers").exists():
        return CgroupParent(path, CgroupVersion.V2)
    if (path / "memory.limit_in_bytes").exists():
        return CgroupParent(path, CgroupVersion.V1)
    raise CgroupUnavailable(f"CLOCKQ_COMMAND_CGROUP={path} is not a cgroup v2 folder nor a v1 memory cgroup")


def _give_children_memory(path: Path) -> None:
    """v2: the memory controller for the cgroups made in `path`, enabled if need be."""
    controllers = path / "cgroup.subtree_control"
    try:
        if "memory" in controllers.read_text().split():
            return
        controllers.write_text("+memory")
    except OSError as exc:
        raise CgroupUnavailable(
            f"the cgroup v2 folder {path} cannot give its children the memory controller "
            f"({exc.strerror or exc}: a cgroup that holds processes cannot); set CLOCKQ_COMMAND_CGROUP to a "
            "cgroup v2 folder of its own for programs, e.g. one that systemd delegates (Delegate=yes)"
        ) from None


def _read_words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup in each hierarchy: controller name → path ('' for v2)."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                found[controller] = path
    return found


def _cgroup_mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root in its hierarchy, fstype, super options) of each cgroup mount."""
    mounts = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            before, after = line.split(" - ", 1)
            fields, (fstype, _source, options) = before.split(), after.split(" ", 2)
            if fstype in ("cgroup", "cgroup2"):
                mounts.append((fields[4], fields[3], fstype, set(options.split(","))))
    return mounts


def _inside(mount_point: str, root: str, path: str) -> Path:
    """Where cgroup `path` of a hierarchy lies under its mount, which may show only a part
    (`root`) of it, as in a container."""
    relative = os.path.relpath(path, root) if path.startswith(root) else path.lstrip("/")
    return Path(mount_point) / ("" if relative == "." else relative)
