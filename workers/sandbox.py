"""Run a job's own program (the `command` workload) with none of clockq's rights.

A program runs inside bubblewrap (`bwrap`, Debian's `bubblewrap`), a small, widely used tool
that Flatpak builds on, rather than namespace code of clockq's own:

- **Its own PID namespace.** When the sandbox's first process ends, or is killed, the kernel
  kills every process left in the namespace, double-forked and `setsid` ones included.
  `--die-with-parent` does the same when the worker dies, even by `kill -9`.
- **Its own view of the files.** The system read-only; private, empty `/tmp`, `/var/tmp` and
  `/dev/shm`; clockq's code, `var/` (database, secrets, broker password) and the checkpoint
  store hidden; the job's work folder, at its usual path, the only writable place. The GPU
  device nodes are passed through, and `CUDA_VISIBLE_DEVICES` is inherited.
- **Its own uid.** As root, a worker runs each program as a uid of its own, taken from a range
  (CLOCKQ_COMMAND_UID_BASE, CLOCKQ_COMMAND_UID_COUNT) that no account uses: by default
  base + job id, so a job keeps its uid across claims and hosts, and a host-wide lock makes sure
  that no two running programs hold the same one. bwrap itself runs as that uid, in a user
  namespace it makes, so nothing in the sandbox has a capability.
- **Limits.** CPU time, open files, file size and processes (RLIMIT_NPROC, which counts per
  uid, so per job); memory through a cgroup of its own or the worker's watchdog, never
  RLIMIT_AS, which CUDA's address-space reservations break (workers/memory_bound.py).
- **Network.** A network namespace of its own, connected outwards by slirp4netns, with no way
  to the host's loopback (workers/program_network.py); CLOCKQ_COMMAND_NETWORK=none gives it
  loopback only, =host the host's network.

bwrap holds the sandbox before it forks the program (--block-fd) until the worker has put its
memory cgroup and network in place (workers/program_bounds.py).

Where bwrap is missing, or cannot make namespaces, command jobs are refused with the reason,
unless the operator sets CLOCKQ_COMMAND_SANDBOX=none: then a program runs as a plain child
process (still as a uid of its own under a root worker), which cleans up only its process group,
on the host's network, its memory held by the watchdog.
A worker that is not root cannot give programs a uid of their own: it refuses command jobs
unless CLOCKQ_ALLOW_SAME_USER_COMMANDS is set, and then still sandboxes them as its own user.

The worker's side of the boundary, the files it touches in the work folder, is in
workers/job_folder.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import getpass
import glob
import json
import logging
import os
import resource
import select
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from workers.memory_bound import MemoryPolicy, memory_policy
from workers.program_network import TUN_DEVICE, NetworkMode, tun_problem
from workers.workloads.base import JobRefused

log = logging.getLogger("clockq.sandbox")

# Host-wide, so that the workers of one host (one per GPU) never give two programs one uid.
UID_LOCK_DIR = Path("/run/clockq/uids")
UID_PROBES = 64  # uids tried past the job's own when that one is held by another running program
SYSTEM_TEMP_DIRS = ("/tmp", "/var/tmp")
GPU_DEVICES = ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/dri")


@dataclass(frozen=True)
class Sandbox:
    """How this worker runs programs, as the settings say (sandbox_for_commands, at each claim)."""

    bwrap: str | None  # None: no sandbox (CLOCKQ_COMMAND_SANDBOX=none, unsafe)
    uids: range | None  # None: programs run as the worker's own user
    limits: tuple[tuple[int, int], ...]  # (resource.RLIMIT_*, value); value 0 leaves it unlimited
    network: NetworkMode
    memory: MemoryPolicy
    slirp4netns: str | None  # its path, where the network is private
    code: Path  # clockq's code: hidden, but a folder in it may be shown (readable)
    readable: tuple[Path, ...]  # folders shown read-only although they lie in a hidden one
    hidden: tuple[Path, ...]  # clockq's data (var/, checkpoints, cache): never shown

    def uid_for(self, job_id: int) -> int | None:
        """The uid a job's program runs as when no other running program holds it."""
        return None if self.uids is None else self.uids[job_id % len(self.uids)]

    def lease_uid(self, job_id: int) -> UidLease | None:
        """A uid no other running program on this host has, held until released: the job's own
        (uid_for) unless another job that maps to it runs now. None without user switching."""
        if self.uids is None:
            return None
        first = job_id % len(self.uids)
        for probe in range(min(UID_PROBES, len(self.uids))):
            lease = UidLease.try_take(self.uids[(first + probe) % len(self.uids)])
            if lease is not None:
                return lease
        raise RuntimeError(f"the {UID_PROBES} uids tried for job {job_id} are all held by running programs")

    def argv(
        self, program: Sequence[str], *, work_dir: Path, info_fd: int | None, block_fd: int | None = None
    ) -> list[str]:
        """The command line that runs `program` in the sandbox (the program itself without one).
        `info_fd`: where bwrap writes the sandbox's first process id, as JSON; `block_fd`: what
        its first process waits on, set up, before it forks the program."""
        if self.bwrap is None:
            return list(program)
        args = [self.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        args += ["--perms", "1777", "--tmpfs", "/dev/shm"]
        for device in _gpu_devices():
            args += ["--dev-bind", device, device]
        for temp in SYSTEM_TEMP_DIRS:
            args += ["--perms", "1777", "--tmpfs", temp]
        # Shown folders come after the folders they may lie in and before clockq's data, so
        # that no setting can show var/ or another job's folder again.
        args += ["--tmpfs", str(self.code)]
        for path in self.readable:
            args += ["--ro-bind-try", str(path), str(path)]
        for path in _outermost(self.hidden):
            args += ["--tmpfs", str(path)]
        args += ["--bind", str(work_dir), str(work_dir), "--chdir", str(work_dir)]
        args += ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if self.network is not NetworkMode.HOST:
            args += ["--unshare-net"]
        args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        if info_fd is not None:
            args += ["--info-fd", str(info_fd)]
        if block_fd is not None:
            args += ["--block-fd", str(block_fd)]
        return [*args, "--", *program]

    def tmpfs_mounts(self) -> tuple[str, ...]:
        """The sandbox's tmpfs mounts, all writable by the program: memory it holds outside its
        processes, which the watchdog counts (a cgroup is charged for them itself)."""
        return ("/dev", "/dev/shm", *SYSTEM_TEMP_DIRS, str(self.code), *map(str, _outermost(self.hidden)))

    def popen_kwargs(self, uid: int | None) -> dict:
        """What subprocess.Popen needs to start the sandbox as `uid` (None: the worker's user)."""
        limits = self.limits
        if uid is not None and settings.CLOCKQ_COMMAND_MAX_PROCESSES:
            # Counted per uid: only a uid of the job's own makes it a limit on the job.
            limits += ((resource.RLIMIT_NPROC, settings.CLOCKQ_COMMAND_MAX_PROCESSES),)
        kwargs: dict = {"umask": 0o077, "preexec_fn": _limits_setter(limits), "start_new_session": True}
        if uid is not None:
            kwargs.update(user=uid, group=uid, extra_groups=[])
        return kwargs

    def env(self, work_dir: Path, uid: int | None) -> dict[str, str]:
        """Who the program is, for programs that ask (HOME for caches, USER for logs)."""
        user = f"job{uid}" if uid is not None else getpass.getuser()
        return {"HOME": str(work_dir), "USER": user, "LOGNAME": user}

    def describe(self) -> str:
        who = (
            f"as a uid of their own ({self.uids.start}-{self.uids.stop - 1})"
            if self.uids is not None
            else "as this worker's own user (CLOCKQ_ALLOW_SAME_USER_COMMANDS)"
        )
        memory = self.memory.describe()
        if self.bwrap is None:
            return (
                f"command jobs: WARNING: run without a sandbox (CLOCKQ_COMMAND_SANDBOX=none), {who}, "
                f"on the host's network, {memory}"
            )
        return f"command jobs: run in a bubblewrap sandbox, {who}, network {self.network.value}, {memory}"


class UidLease:
    """A uid held for one running program: an flock on a root-only file, which the kernel
    releases if the worker dies (and with it, through the PID namespace, the program). The file
    is removed at release, so that /run does not fill with one file a job."""

    def __init__(self, uid: int, fd: int):
        self.uid = uid
        self._fd: int | None = fd

    @classmethod
    def try_take(cls, uid: int) -> UidLease | None:
        UID_LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = UID_LOCK_DIR / str(uid)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            try:
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    return cls(uid, fd)
            except FileNotFoundError:
                pass
            os.close(fd)  # its holder removed it as we locked it: lock the file there now

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(UID_LOCK_DIR / str(self.uid))  # still locked: nobody holds it meanwhile
            os.close(self._fd)
            self._fd = None


class Pidfd:
    """A process, held by a pidfd: signals reach that process, never another that was given
    its pid after it was gone."""

    def __init__(self, pid: int, fd: int):
        self.pid = pid
        self.fd = fd

    @classmethod
    def open(cls, pid: int | None) -> Pidfd | None:
        if pid is None:
            return None
        try:
            return cls(pid, os.pidfd_open(pid))
        except ProcessLookupError:
            return None  # gone already

    def send(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.fd, signum)

    def wait(self) -> None:
        """Until the process has exited (a pidfd reads as ready then)."""
        select.select([self.fd], [], [])

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def read_child_pid(fd: int) -> int | None:
    """The sandbox's first process, from what bwrap writes to its --info-fd (`fd`, closed here);
    None when bwrap exited without writing it."""
    data = b""
    try:
        while chunk := os.read(fd, 4096):
            data += chunk
            if b"}" in data:
                break
    finally:
        os.close(fd)
    try:
        pid = json.loads(data)["child-pid"]
    except (ValueError, KeyError, TypeError):
        return None
    return pid if isinstance(pid, int) and pid > 0 else None


def first_child(namespace: Pidfd, bwrap: subprocess.Popen, timeout_s: float = 5.0) -> int | None:
    """The program's own process: the first child of the sandbox's first process (bwrap's init,
    which forks the program at once). None if the sandbox ended first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and bwrap.poll() is None:
        try:
            with open(f"/proc/{namespace.pid}/task/{namespace.pid}/children") as f:
                children = f.read().split()
        except OSError:
            return None
        if children:
            return int(children[0])
        time.sleep(0.0005)
    return None


def sandbox_for_commands() -> Sandbox:
    """How this worker runs programs, or JobRefused saying why it cannot run them safely."""
    limits = (
        (resource.RLIMIT_CPU, settings.CLOCKQ_COMMAND_CPU_S),
        (resource.RLIMIT_NOFILE, settings.CLOCKQ_COMMAND_MAX_FILES),
        (resource.RLIMIT_FSIZE, settings.CLOCKQ_COMMAND_MAX_FILE_MB * 2**20),
    )
    if os.geteuid() == 0:
        uids = range(
            settings.CLOCKQ_COMMAND_UID_BASE, settings.CLOCKQ_COMMAND_UID_BASE + settings.CLOCKQ_COMMAND_UID_COUNT
        )
        _check_uids_usable(uids)
    elif settings.CLOCKQ_ALLOW_SAME_USER_COMMANDS:
        uids = None
    else:
        raise JobRefused(
            "this worker does not run as root, so it cannot give a job's program a uid of its own; "
            "run the GPU workers as root, or set CLOCKQ_ALLOW_SAME_USER_COMMANDS=true to run programs "
            "as the worker's own user"
        )
    bwrap = None
    if settings.CLOCKQ_COMMAND_SANDBOX == "bwrap":
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise JobRefused(
                "bubblewrap (bwrap) is not installed on this worker, so a job's program cannot be sandboxed: "
                "install it (apt-get install bubblewrap), or set CLOCKQ_COMMAND_SANDBOX=none to run programs "
                "without a sandbox (unsafe)"
            )
        probe_uid = None if uids is None else uids[0]
        problem = bwrap_problem(bwrap, probe_uid)
        if problem:
            raise JobRefused(
                f"bubblewrap cannot make a sandbox on this worker ({problem}); allow unprivileged user "
                "namespaces (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu also "
                "kernel.apparmor_restrict_unprivileged_userns=0), or set CLOCKQ_COMMAND_SANDBOX=none (unsafe)"
            )
    network = NetworkMode(settings.CLOCKQ_COMMAND_NETWORK)
    slirp4netns = None
    if bwrap is not None and network is NetworkMode.PRIVATE:
        slirp4netns = shutil.which("slirp4netns")
        if slirp4netns is None:
            raise JobRefused(
                "slirp4netns is not installed on this worker, so a job's program cannot have a network of its "
                "own (CLOCKQ_COMMAND_NETWORK=private): install it (apt-get install slirp4netns), or set "
                "CLOCKQ_COMMAND_NETWORK=none (loopback only) or host (unsafe: programs reach the host's "
                "loopback services)"
            )
        problem = tun_problem(None if uids is None else uids[0])
        if problem:
            raise JobRefused(
                f"slirp4netns cannot give a job's program a network of its own on this worker ({problem}); "
                f"make it readable and writable by all (chmod 0666 {TUN_DEVICE}, Debian's default), or set "
                "CLOCKQ_COMMAND_NETWORK=none (loopback only) or host (unsafe)"
            )
    memory = memory_policy(sandboxed=bwrap is not None)
    if memory.cgroup is not None:
        sweep_leftover_cgroups(memory.cgroup.path)
    hidden = (settings.VAR_DIR, settings.CLOCKQ_CHECKPOINT_DIR, settings.CLOCKQ_CACHE_DIR)
    return Sandbox(
        bwrap=bwrap,
        uids=uids,
        limits=limits,
        network=network,
        memory=memory,
        slirp4netns=slirp4netns,
        code=Path(settings.BASE_DIR).resolve(),
        readable=tuple(Path(p).resolve() for p in settings.CLOCKQ_COMMAND_READ_PATHS),
        hidden=tuple(Path(p).resolve() for p in hidden),
    )


@functools.cache
def bwrap_problem(bwrap: str, uid: int | None) -> str:
    """Why bwrap cannot make the namespaces a program runs in, as `uid`; '' when it can. Asked
    once a process: the kernel's answer does not change while a worker runs."""
    argv = [bwrap, "--ro-bind", "/", "/", "--unshare-user", "--unshare-pid", "--die-with-parent", "--", "true"]
    try:
        done = subprocess.run(
            argv, capture_output=True, timeout=30, user=uid, group=uid, extra_groups=None if uid is None else []
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return "" if done.returncode == 0 else (done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}")


@functools.cache
def sweep_leftover_cgroups(parent: Path) -> None:
    """Remove the empty cgroups that workers killed while their programs ran left in `parent`
    (once a process): each one whose uid no running program holds (a program's cgroup is named
    for its uid, which it holds host-wide while it runs)."""
    for path in parent.glob("clockq-uid*"):
        uid = path.name.removeprefix("clockq-uid")
        lease = UidLease.try_take(int(uid)) if uid.isdigit() else None
        if lease is None:
            continue  # its program runs, or not a name of ours
        try:
            path.rmdir()
        except OSError:
            pass  # not empty: its processes are exiting; a later start of that uid replaces it
        finally:
            lease.release()


def _check_uids_usable(uids: range) -> None:
    """The range must be mapped in this worker's user namespace (a container may map only a few
    thousand uids) and hold no account, root's least of all."""
    if uids.start <= 0:
        raise JobRefused("CLOCKQ_COMMAND_UID_BASE must be above 0: a program must never run as root")
    with contextlib.suppress(OSError):
        mapped = [tuple(map(int, line.split())) for line in Path("/proc/self/uid_map").read_text().splitlines()]
        if not any(inside <= uids.start and uids.stop <= inside + count for inside, _, count in mapped):
            raise JobRefused(
                f"the uids {uids.start}-{uids.stop - 1} for jobs' programs are not all mapped in this worker's "
                "user namespace (/proc/self/uid_map); set CLOCKQ_COMMAND_UID_BASE and CLOCKQ_COMMAND_UID_COUNT "
                "to a range inside it"
            )


def prepare_work_dir(work_dir: Path, checkpoint_root: Path, uid: int | None) -> None:
    """Make the work folder the program's own, and its way there crossable but not listable.

    The checkpoint root and the job's folder become 0711: the sandbox, which sets itself up as
    the program's uid, can pass through to the work folder, but cannot list them, and the
    checkpoint files in them stay 0600. Folders above the checkpoint root are the operator's:
    if one cannot be crossed, say which.
    """
    if uid is None:
        return
    root, job_dir = checkpoint_root.resolve(), work_dir.resolve().parent
    if job_dir.parent != root:
        # Never change the modes of folders clockq does not own.
        raise JobRefused(f"{work_dir} is not a job's work folder under CLOCKQ_CHECKPOINT_DIR ({root})")
    # The job's folder is the worker's (root's): the program cannot have put a link there, but
    # the work folder itself is not followed either, to be sure.
    os.chmod(work_dir, 0o700, follow_symlinks=False)
    for folder in (job_dir, root):
        folder.chmod(0o711)
    for folder in root.parents:
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            raise JobRefused(
                f"{folder} cannot be crossed by jobs' programs, so a program could not reach its work folder; "
                "give that folder mode 0711, or move CLOCKQ_CHECKPOINT_DIR"
            )


def _gpu_devices() -> list[str]:
    return sorted({path for pattern in GPU_DEVICES for path in glob.glob(pattern)})


def _outermost(paths: Sequence[Path]) -> list[Path]:
    """The paths that exist and lie in no other of them (a folder hidden inside a hidden one
    needs no mount of its own)."""
    present = [p for p in dict.fromkeys(paths) if p.exists()]
    return [p for p in present if not any(other != p and p.is_relative_to(other) for other in present)]


def _limits_setter(limits: tuple[tuple[int, int], ...]) -> Callable[[], None]:
    def apply() -> None:  # runs in the child between fork and exec
        for which, value in limits:
            if value > 0:
                resource.setrlimit(which, (value, value))

    return apply
