"""Whether a `command` job's program could start, told apart from faults of the host.

A program that cannot start (no program named, no such file, not executable, not a program) will
never start, however often it is tried: the job fails at once with the reason, and is not
retried (`ProgramCannotStart` is a `JobRefused`). Anything else that goes wrong while starting it
is the host's (the disk, memory, process limits, the sandbox): a disk fault goes back to the
queue uncharged as a storage fault; the others are retried as before.

Inside bubblewrap the program is started by bwrap after the sandbox is set up, so its failure
to start shows only as bwrap's exit 1 with `bwrap: execvp <name>: <reason>` on the program's
stderr; that line, and only it, counts as the program's own failure to start.

Once started, the program is given up to 2 seconds to install its SIGUSR1 handler, which
`catches_signal` reads from /proc. It starts with `program_environment`: the worker's, less
everything of clockq's.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from clockq.jobs.checkpoints import StorageError
from workers.workloads.base import JobRefused

# Errors of exec() that are the program's: the file, not the host.
_PROGRAM_ERRNOS = frozenset(
    {errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.EISDIR, errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP}
)
# Errors of the work folder's disk: never the job's fault.
_DISK_ERRNOS = frozenset({errno.EIO, errno.ENOSPC, errno.EROFS, errno.EDQUOT})
BWRAP_EXEC_FAILED = "bwrap: execvp "


class ProgramCannotStart(JobRefused):
    """The job's program cannot start (its name, its file): the job fails at once, not retried."""


def program_problem(argv0: str, path: str, cwd: Path) -> str | None:
    """Why the program `argv0` cannot start, as far as this worker can see (a sandbox sees less
    of the system, never more), or None. A name without '/' is looked up on `path`."""
    if not argv0.strip():
        return "the program's name (argv[0]) is empty"
    if "/" not in argv0:
        if shutil.which(argv0, path=path) is None:
            return f"{argv0!r} is not found on PATH ({path})"
        return None
    target = Path(argv0) if os.path.isabs(argv0) else cwd / argv0
    if not target.exists():
        return f"{argv0!r}: no such file"
    if target.is_dir():
        return f"{argv0!r} is a folder, not a program"
    if not os.access(target, os.X_OK):
        return f"{argv0!r} is not executable"
    return None


def cannot_start(argv0: str, why: str) -> ProgramCannotStart:
    return ProgramCannotStart(f"could not start the program {argv0!r}: {why}; fix the job's argv and submit it again")


def start_error(exc: OSError, argv0: str, *, sandboxed: bool) -> Exception:
    """What an OSError from starting the program (or bwrap, `sandboxed`) means for the job."""
    if not sandboxed and exc.errno in _PROGRAM_ERRNOS:
        return cannot_start(argv0, exc.strerror or str(exc))
    if exc.errno in _DISK_ERRNOS:
        return StorageError(f"cannot start the program: the work folder's disk failed ({exc})")
    return RuntimeError(f"could not start {argv0!r}: {exc}")


def exec_failure(code: int, stderr_tail: str, argv0: str, *, sandboxed: bool) -> ProgramCannotStart | None:
    """bwrap's report that the program itself could not be executed, from its exit and stderr."""
    first = stderr_tail.lstrip().splitlines()[0] if stderr_tail.strip() else ""
    if not sandboxed or code != 1 or not first.startswith(BWRAP_EXEC_FAILED):
        return None
    return cannot_start(argv0, first.split(": ", 2)[-1] if first.count(": ") >= 2 else first)


def catches_signal(pid: int, signum: int) -> bool | None:
    """Whether process `pid` has a handler for `signum` (the SigCgt mask in /proc/PID/status);
    None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


# Settings a job's program must not see: clockq's database, broker (address and password),
# secrets, ports and every other clockq, Celery, Django and Flower setting.
WITHHELD_ENV = frozenset({"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "PORT"})
WITHHELD_ENV_PREFIXES = ("CLOCKQ_", "CELERY", "DJANGO_", "FLOWER_")


def program_environment(worker_env: dict[str, str]) -> dict[str, str]:
    """The worker's environment less everything of clockq's: what a program may inherit (PATH,
    locale, CUDA_VISIBLE_DEVICES, its own libraries' settings)."""
    return {
        name: value
        for name, value in worker_env.items()
        if name not in WITHHELD_ENV and not name.startswith(WITHHELD_ENV_PREFIXES)
    }
