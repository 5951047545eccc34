"""Run a job's own program (the `command` workload) with none of clockq's rights.

As root, a worker runs the program as a dedicated unprivileged user (CLOCKQ_COMMAND_USER, made
here if missing), with the job's work folder as its only writable place and resource limits
from settings. It gets no credentials: the environment is stripped of clockq's settings, and
var/ (database, secret key, broker password) is readable by clockq's own user only.

A worker that is not root cannot switch users. It then refuses command jobs, unless the
operator sets CLOCKQ_ALLOW_SAME_USER_COMMANDS to run them as the worker's own user.

What one dedicated user cannot give: two command jobs running at the same moment share it, so
each could reach the other's work folder while both run. Other jobs' checkpoints, and
everything of clockq's, stay out of reach.
"""

from __future__ import annotations

import getpass
import logging
import os
import pwd
import re
import resource
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from workers.workloads.base import JobRefused

log = logging.getLogger("clockq.sandbox")

_USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,30}$")


@dataclass(frozen=True)
class Sandbox:
    user: str
    uid: int | None  # None: the worker's own user (only when the operator allows it)
    gid: int | None
    limits: tuple[tuple[int, int], ...]  # (resource.RLIMIT_*, value); value 0 leaves it unlimited

    @property
    def switches_user(self) -> bool:
        return self.uid is not None

    def popen_kwargs(self) -> dict:
        """What subprocess.Popen needs to start the program inside the sandbox."""
        kwargs: dict = {"umask": 0o077, "preexec_fn": _limits_setter(self.limits)}
        if self.switches_user:
            kwargs.update(user=self.uid, group=self.gid, extra_groups=[])
        return kwargs

    def env(self, work_dir: Path) -> dict[str, str]:
        """Who the program is, for programs that ask (HOME for caches, USER for logs)."""
        return {"HOME": str(work_dir), "USER": self.user, "LOGNAME": self.user}

    def hand_over(self, path: Path) -> None:
        """Give a file or folder clockq made for the program (its work folder, the checkpoint it
        resumes from) to the program's user."""
        if self.switches_user:
            os.chown(path, self.uid, self.gid)  # type: ignore[arg-type]


def sandbox_for_commands() -> Sandbox:
    """How this worker runs programs, or JobRefused saying why it cannot."""
    limits = (
        (resource.RLIMIT_CPU, settings.CLOCKQ_COMMAND_CPU_S),
        (resource.RLIMIT_AS, settings.CLOCKQ_COMMAND_MEMORY_MB * 2**20),
        (resource.RLIMIT_NOFILE, settings.CLOCKQ_COMMAND_MAX_FILES),
        (resource.RLIMIT_FSIZE, settings.CLOCKQ_COMMAND_MAX_FILE_MB * 2**20),
    )
    if os.geteuid() == 0:
        entry = ensure_command_user(settings.CLOCKQ_COMMAND_USER)
        return Sandbox(entry.pw_name, entry.pw_uid, entry.pw_gid, limits)
    if settings.CLOCKQ_ALLOW_SAME_USER_COMMANDS:
        return Sandbox(getpass.getuser(), None, None, limits)
    raise JobRefused(
        "this worker does not run as root, so it cannot run a job's program as another user; "
        "run the GPU workers as root (they switch to CLOCKQ_COMMAND_USER), or set "
        "CLOCKQ_ALLOW_SAME_USER_COMMANDS=true to run programs as the worker's own user"
    )


def ensure_command_user(name: str) -> pwd.struct_passwd:
    """The dedicated user, made (as a system user with no home and no shell) if missing."""
    if not _USER_NAME.match(name) or name == "root":
        raise JobRefused(f"CLOCKQ_COMMAND_USER={name!r} is not a usable unprivileged user name")
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ],
            check=True,
            capture_output=True,
        )
        log.info("created the user %s that runs jobs' programs", name)
        entry = pwd.getpwnam(name)
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise JobRefused(f"CLOCKQ_COMMAND_USER={name!r} has uid or gid 0; it must be unprivileged")
    return entry


def prepare_work_dir(work_dir: Path, checkpoint_root: Path, sandbox: Sandbox) -> None:
    """Make the work folder the program's own, and its way there crossable but not listable.

    The checkpoint root and the job's folder become 0711: the program can pass through to its
    work folder, but cannot list them, and the checkpoint files in them stay 0600. Folders above
    the checkpoint root are the operator's: if one cannot be crossed, say which.
    """
    if not sandbox.switches_user:
        return
    root, job_dir = checkpoint_root.resolve(), work_dir.resolve().parent
    if job_dir.parent != root:
        # Never change the modes of folders clockq does not own.
        raise JobRefused(f"{work_dir} is not a job's work folder under CLOCKQ_CHECKPOINT_DIR ({root})")
    work_dir.chmod(0o700)
    sandbox.hand_over(work_dir)
    for folder in (job_dir, root):
        folder.chmod(0o711)
    for folder in root.parents:
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            raise JobRefused(
                f"{folder} cannot be crossed by {sandbox.user}, so its program could not reach its work folder; "
                "give that folder mode 0711, or move CLOCKQ_CHECKPOINT_DIR"
            )


def _limits_setter(limits: tuple[tuple[int, int], ...]) -> Callable[[], None]:
    def apply() -> None:  # runs in the child between fork and exec
        for which, value in limits:
            if value > 0:
                resource.setrlimit(which, (value, value))

    return apply
