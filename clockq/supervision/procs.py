"""Processes as /proc shows them, named so that a recycled pid is never taken for the old one.

A pid alone names a process only while it lives: once it ends, the kernel may give the number to
anything else. A pid with its start time (field 22 of /proc/PID/stat, clock ticks since boot),
on the same boot, names one process for ever. Signals go through a pidfd opened and then checked
against that start time, so nothing is signalled that took the number in between.

Standard library only: `make run` runs clockq/stack/leftovers.py, which imports this, with the
system's python3 before the virtual environment exists.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Identity:
    """One process for ever: its pid and its start time on this boot."""

    pid: int
    start: int


@dataclass(frozen=True)
class Seen:
    """What /proc says of a live process."""

    pid: int
    start: int
    ppid: int
    pgrp: int
    uid: int


def boot_id() -> str:
    """This boot's id: start times of another boot mean nothing on this one."""
    return (PROC / "sys/kernel/random/boot_id").read_text().strip()


def seen(pid: int) -> Seen | None:
    """The live process `pid`, or None when there is none (or it is a zombie: it is gone but
    for its exit code, and holds nothing)."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
        uid = (PROC / str(pid)).stat().st_uid
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name, in parentheses, may hold spaces and parentheses: the fields follow the last ')'.
    fields = raw.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return Seen(pid=pid, start=int(fields[19]), ppid=int(fields[1]), pgrp=int(fields[2]), uid=uid)


def identity(pid: int) -> Identity | None:
    process = seen(pid)
    return None if process is None else Identity(process.pid, process.start)


def is_alive(who: Identity) -> bool:
    return identity(who.pid) == who


def all_seen() -> list[Seen]:
    """Every live process this user may see in /proc."""
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            process = seen(int(entry.name))
            if process is not None:
                found.append(process)
    return found


def working_directory(pid: int) -> Path | None:
    """Where process `pid` works, or None when it is gone or not this user's to read."""
    try:
        return Path(os.readlink(PROC / str(pid) / "cwd"))
    except OSError:
        return None


def command_line(pid: int, limit: int = 100) -> str:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    text = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def open_pidfd(who: Identity) -> int | None:
    """A pidfd for `who` itself, or None when it is gone (its pid free or someone else's now)."""
    try:
        fd = os.pidfd_open(who.pid)
    except (ProcessLookupError, PermissionError):
        return None
    # The pidfd names whatever had the pid when it was opened: checked after, the start time
    # says whether that is still `who`.
    if identity(who.pid) != who:
        os.close(fd)
        return None
    return fd


def send(fd: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        signal.pidfd_send_signal(fd, sig)


def wait_gone(fds: list[int], timeout_s: float) -> list[int]:
    """Wait until the processes behind `fds` have ended, at most `timeout_s`; those still alive."""
    left = list(fds)
    deadline = time.monotonic() + timeout_s
    while left:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        poller = select.poll()
        for fd in left:
            poller.register(fd, select.POLLIN)  # a pidfd becomes readable when its process ends
        ended = {fd for fd, _event in poller.poll(remaining * 1000)}
        left = [fd for fd in left if fd not in ended]
    return left
