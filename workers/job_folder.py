"""Files in a folder that a job's program can write, touched without following its links.

The program owns its work folder: anything in it may be swapped, at any moment, for a symbolic
link to a file only the worker may read or write, a hard link to one, a FIFO that blocks
whoever opens it, or a folder. So the worker (root) never opens a path there. Every entry is
opened relative to a descriptor of the folder, with O_NOFOLLOW and O_NONBLOCK, and used only
if it is a regular file with a single link that belongs to the job's uid (or to the worker,
which made it). Ownership is given with fchown on a descriptor, a name is changed with a
rename inside the folder, and nothing is chowned or renamed by path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from pathlib import Path

_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
TEMP_SUFFIX = ".clockq-tmp"
# O_NOFOLLOW on a link gives ELOOP; O_NONBLOCK on a FIFO with no reader or a socket, ENXIO.
_NOT_A_FILE = (errno.ELOOP, errno.ENXIO)


class UnsafeEntry(OSError):
    """An entry the worker will not use: a link, not a regular file, or not the job's."""


class JobFolder:
    """A folder the job's program controls, held open by descriptor. `owner`: the program's
    uid (None when programs run as the worker's own user)."""

    def __init__(self, path: Path, owner: int | None, *, parent: JobFolder | None = None):
        flags = os.O_RDONLY | os.O_DIRECTORY | _OPEN
        self.path = path
        self.owner = owner
        self.fd: int = os.open(path.name if parent else path, flags, dir_fd=parent.fd if parent else None)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> JobFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def subfolder(self, name: str) -> JobFolder:
        """A folder in this one, opened without following a link (FileNotFoundError if none)."""
        return JobFolder(self.path / name, self.owner, parent=self)

    # -- reading ------------------------------------------------------------------------------

    def open_file(self, name: str) -> int:
        """A descriptor of the regular file `name`, for reading; UnsafeEntry for anything else,
        FileNotFoundError when there is none."""
        try:
            fd = os.open(name, os.O_RDONLY | _OPEN, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in _NOT_A_FILE:
                raise UnsafeEntry(exc.errno, f"{name} is a link or not a regular file") from None
            raise
        try:
            self._check(fd, name)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read(self, name: str, limit: int | None = None) -> bytes | None:
        """The content of the regular file `name` (at most `limit` bytes), or None if there is
        none. UnsafeEntry if it is not a file the worker may use."""
        try:
            fd = self.open_file(name)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as f:
            return f.read() if limit is None else f.read(limit)

    def copy_fd_to(self, fd: int, target: Path, *, limit: int) -> None:
        """Copy at most `limit` bytes of the open file `fd` (from open_file) to a new file
        `target` outside the folder, leaving `fd` open."""
        with open(target, "xb") as out:
            offset = 0
            while offset < limit and (chunk := os.pread(fd, min(1 << 20, limit - offset), offset)):
                out.write(chunk)
                offset += len(chunk)

    def signature(self, name: str) -> tuple[int, int, int] | None:
        """What changes when `name` is written or replaced (not following a link): None if absent."""
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def exists(self, name: str) -> bool:
        return self.signature(name) is not None

    def names(self) -> list[str]:
        return os.listdir(self.fd)

    # -- writing ------------------------------------------------------------------------------

    def open_log(self, name: str) -> int:
        """A descriptor that appends to the log `name` and can read it back (pread): the file
        there if it is a regular file of the job's, else a new one in its place. The program
        writes through this descriptor, so whatever it later puts at that name is never read."""
        try:
            fd = os.open(name, os.O_RDWR | os.O_APPEND | _OPEN, dir_fd=self.fd)
        except FileNotFoundError:
            return self._create(name, os.O_RDWR | os.O_APPEND)
        except OSError as exc:
            if exc.errno not in _NOT_A_FILE:  # a folder, say: the error says so
                raise
            self.unlink(name)
            return self._create(name, os.O_RDWR | os.O_APPEND)
        try:
            self._check(fd, name)
        except UnsafeEntry:
            os.close(fd)
            self.unlink(name)
            return self._create(name, os.O_RDWR | os.O_APPEND)
        return fd

    def write_atomic(self, name: str, data: bytes) -> None:
        """Replace `name` with a file holding `data`, given to the owner: written to a temporary
        name, fsynced, then renamed, all inside the folder, whatever the program left there."""
        tmp = name + TEMP_SUFFIX
        self.unlink(tmp)
        fd = self._create(tmp, os.O_WRONLY)
        try:
            with os.fdopen(fd, "wb", closefd=False) as f:
                f.write(data)
                f.flush()
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def unlink(self, name: str) -> None:
        """Remove the entry `name` (a link itself, never what it points to), if there is one."""
        with contextlib.suppress(FileNotFoundError):
            try:
                os.unlink(name, dir_fd=self.fd)
            except IsADirectoryError:
                raise UnsafeEntry(errno.EISDIR, f"{name} in the work folder is a folder; remove it") from None

    def clear(self, keep: tuple[str, ...] = ()) -> None:
        """Remove everything in the folder but the entries named in `keep`, links themselves
        (never what they point to) and folders with all they hold (shutil.rmtree with a
        descriptor does not follow a link either)."""
        for name in self.names():
            if name in keep:
                continue
            try:
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(name, dir_fd=self.fd)
                else:
                    os.unlink(name, dir_fd=self.fd)
            except FileNotFoundError:
                pass

    def give_tree_to_owner(self) -> None:
        """Make everything in the folder the owner's (after the program's uid changed), never
        following a link: the program that made the tree has ended."""
        if self.owner is None:
            return
        os.fchown(self.fd, self.owner, self.owner)
        for _, dirs, files, dir_fd in os.fwalk(dir_fd=self.fd, follow_symlinks=False):
            for entry in dirs + files:
                os.chown(entry, self.owner, self.owner, dir_fd=dir_fd, follow_symlinks=False)

    def owned_by(self) -> int:
        return os.fstat(self.fd).st_uid

    # -- the checks -----------------------------------------------------------------------

    def _create(self, name: str, flags: int) -> int:
        fd = os.open(name, flags | os.O_CREAT | os.O_EXCL | _OPEN, 0o600, dir_fd=self.fd)
        if self.owner is not None:
            os.fchown(fd, self.owner, self.owner)
        return fd

    def _check(self, fd: int, name: str) -> None:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeEntry(0, f"{name} is not a regular file")
        # A hard link to a file of someone else's is a regular file too: refuse it.
        if st.st_nlink != 1 or st.st_uid not in (self.owner, os.geteuid()):
            raise UnsafeEntry(0, f"{name} is not the job's own file")
