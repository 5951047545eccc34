"""A host's data cache (CLOCKQ_CACHE_DIR), held to a total size and to the disk's free space.

The cache lies on the disk that also holds the database and the broker's append-only file, and
what goes into it is chosen by users (keras_train's `seed` and `dataset_examples`), so its key
space is theirs too. Whatever the keys, it holds at most CLOCKQ_CACHE_MB, and it never writes an
entry that would leave the disk with less than CLOCKQ_CACHE_RESERVE_PERCENT of its size free.
Room is made by dropping the least recently used entries first; `trim()` also gives room back
when something else fills the disk.

- **Writers** hold an exclusive lock on the folder (`flock` on `.lock`) while they make room,
  write the entry to a temporary name, fsync it and rename it into place. Only a writer holding
  the lock has a temporary file, so one found under the lock is a dead writer's and is removed.
  Two workers of a host that build the same entry at once write it once: the second finds it
  there under the lock. The lock is held only to write data already in memory, never to build.
- **Readers** take no lock. An entry is opened once (`open_entry`) and read through that
  descriptor: on Linux a file unlinked while open stays readable until it is closed, so evicting
  an entry someone is reading is safe. Its space comes back only when they close it; the free
  space the reserve is judged by (statvfs) counts that space as used, so the reserve holds.
- **Recency** is the entry's mtime, set by the cache itself (to the nanosecond, not the kernel's
  coarse clock) when it is written and whenever it is used.

An entry the cache cannot take (bigger than the whole cache, or no room on the disk) is not an
error: the cache only saves its user a rebuild. `put` says why (`Stored`), and the caller keeps
its data in memory.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, cast

log = logging.getLogger("clockq.data_cache")

MB = 1024 * 1024
LOCK_NAME = ".lock"
BUILDING_PREFIX = ".building-"


@dataclass(frozen=True)
class CacheBounds:
    """The cache's size (bytes) and the share of its disk it leaves free (percent)."""

    max_bytes: int
    reserve_percent: float

    @classmethod
    def from_settings(cls) -> CacheBounds:
        from django.conf import settings

        return cls(settings.CLOCKQ_CACHE_MB * MB, settings.CLOCKQ_CACHE_RESERVE_PERCENT)


class Stored(enum.Enum):
    """What `put` did with an entry."""

    WRITTEN = "written"
    ALREADY_THERE = "already there"  # another writer of the host got there first
    TOO_BIG = "bigger than the whole cache (CLOCKQ_CACHE_MB)"
    NO_ROOM = "no room on the disk above its reserve (CLOCKQ_CACHE_RESERVE_PERCENT)"
    FULL = "the cache is full, and a prefetch drops nothing to make room"
    FAILED = "could not be written"

    @property
    def kept(self) -> bool:
        return self in (Stored.WRITTEN, Stored.ALREADY_THERE)


@dataclass(frozen=True)
class Entry:
    name: str
    size: int  # bytes it takes: its apparent size or its blocks, whichever is larger
    last_used_ns: int


class DataCache:
    """The entries of one cache folder. Names are flat file names chosen by the caller."""

    def __init__(self, directory: Path, bounds: CacheBounds):
        self.directory = Path(directory)
        self.bounds = bounds

    # --- readers -----------------------------------------------------------------------------

    def open_entry(self, name: str) -> BinaryIO | None:
        """The entry opened for reading, marked as just used; None if it is not there. Read it
        through this file object only: the entry may be evicted meanwhile, and stays readable."""
        try:
            fd = os.open(self._path(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None
        f = os.fdopen(fd, "rb")
        self._mark_used(fd)
        return f

    def touch(self, name: str) -> bool:
        """Mark the entry as just used (a job about to read it); whether it is there."""
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            fd = os.open(self._path(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                self._mark_used(fd)
            finally:
                os.close(fd)
            return True
        return False

    def entries(self) -> list[Entry]:
        """The entries, least recently used first (ties by name)."""
        found = []
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        for name in names:
            if name == LOCK_NAME or name.startswith(BUILDING_PREFIX):
                continue
            try:
                st = os.lstat(self.directory / name)
            except FileNotFoundError:
                continue  # evicted as we looked
            if not stat.S_ISREG(st.st_mode):
                continue
            found.append(Entry(name, max(st.st_size, st.st_blocks * 512), st.st_mtime_ns))
        return sorted(found, key=lambda e: (e.last_used_ns, e.name))

    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries())

    # --- writers -----------------------------------------------------------------------------

    def put(self, name: str, size: int, write: Callable[[BinaryIO], None], *, evict: bool = True) -> Stored:
        """Store an entry of at most `size` bytes, written by `write(file)`, making room for it
        by evicting the least recently used entries (unless `evict` is false: then it takes
        only room that is free). Atomic: readers see the whole entry or none. An entry that
        writes more than `size` is discarded (FAILED), so the bound holds. Never raises for a
        cache that cannot take the entry: the result says why."""
        path = self._path(name)
        if size > self.bounds.max_bytes:
            return Stored.TOO_BIG
        try:
            with self._locked():
                if self.touch(name):
                    return Stored.ALREADY_THERE
                if evict and not self._make_room(size):
                    return Stored.NO_ROOM
                if not evict and (refused := self.refusal(size, evict=False)) is not None:
                    return refused
                self._write(path, size, write)
                return Stored.WRITTEN
        except (OSError, _WroteTooMuch) as exc:
            log.warning("data cache: could not store %s: %s", name, exc)
            return Stored.FAILED

    def refusal(self, size: int, *, evict: bool = True) -> Stored | None:
        """Why `put` would refuse an entry of `size` bytes as things are now (TOO_BIG, NO_ROOM,
        FULL), or None: asked before building an entry, so that none is built for nothing."""
        if size > self.bounds.max_bytes:
            return Stored.TOO_BIG
        self.directory.mkdir(parents=True, exist_ok=True)  # statvfs needs it
        total, free = self.total_bytes(), self._free_bytes()
        if free + total - size < self._reserve_bytes():
            return Stored.NO_ROOM
        if not evict and not self._fits(total, free, size):
            return Stored.FULL
        return None

    def trim(self) -> list[str]:
        """Evict least recently used entries until the cache is within its bounds again (its
        size, the disk's reserve): after the bounds were lowered, or when something else is
        filling the disk. Returns the names evicted."""
        if not self.directory.is_dir():
            return []
        with self._locked():
            return self._evict_until(lambda total, free: self._fits(total, free, 0))

    def _make_room(self, size: int) -> bool:
        """Under the lock: evict until `size` more bytes fit both bounds; False (evicting
        nothing) if even an empty cache would leave the disk below its reserve."""
        total, free = self.total_bytes(), self._free_bytes()
        if free + total - size < self._reserve_bytes():
            return False
        self._evict_until(lambda t, f: self._fits(t, f, size))
        return self._fits(self.total_bytes(), self._free_bytes(), size)

    def _fits(self, total: int, free: int, size: int) -> bool:
        return total + size <= self.bounds.max_bytes and free - size >= self._reserve_bytes()

    def _evict_until(self, fits: Callable[[int, int], bool]) -> list[str]:
        evicted = []
        entries = self.entries()
        total = sum(e.size for e in entries)
        for entry in entries:
            if fits(total, self._free_bytes()):
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / entry.name)
                evicted.append(entry.name)
            total -= entry.size
        if evicted:
            log.info("data cache: evicted, least recently used first: %s", ", ".join(evicted))
        return evicted

    def _write(self, path: Path, size: int, write: Callable[[BinaryIO], None]) -> None:
        tmp = self.directory / f"{BUILDING_PREFIX}{os.getpid()}-{path.name}"
        try:
            with open(tmp, "xb") as f:
                write(cast(BinaryIO, _Bounded(f, size)))  # a file as far as its writer can tell
                f.flush()
                if os.fstat(f.fileno()).st_size > size:  # a write that went around _Bounded
                    raise _WroteTooMuch(f"the entry grew past the {size:,} bytes it declared")
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self._mark_used(fd)
        finally:
            os.close(fd)
        _fsync_dir(self.directory)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._remove_dead_writers()
            yield
        finally:
            os.close(fd)  # releases the lock

    def _remove_dead_writers(self) -> None:
        # Writers have temporary files only while they hold the lock, which we now hold.
        for name in os.listdir(self.directory):
            if name.startswith(BUILDING_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.directory / name)

    # --- the disk ----------------------------------------------------------------------------

    def _free_bytes(self) -> int:
        vfs = os.statvfs(self.directory)
        return vfs.f_bavail * vfs.f_frsize

    def _reserve_bytes(self) -> int:
        vfs = os.statvfs(self.directory)
        return int(vfs.f_blocks * vfs.f_frsize * self.bounds.reserve_percent / 100)

    def _path(self, name: str) -> Path:
        if not name or "/" in name or name.startswith(".") or name != os.path.basename(name):
            raise ValueError(f"not a data cache entry name: {name!r}")
        return self.directory / name

    @staticmethod
    def _mark_used(fd: int) -> None:
        # The cache's own clock, to the nanosecond: the kernel stamps files with a coarse one,
        # which would tie entries used a few milliseconds apart.
        now = time.time_ns()
        with contextlib.suppress(OSError):  # a read-only cache still serves its entries
            os.utime(fd, ns=(now, now))


class _WroteTooMuch(Exception):
    pass


class _Bounded:
    """A write-only file that refuses to grow past `limit` bytes."""

    def __init__(self, f: BinaryIO, limit: int):
        self._f, self._limit = f, limit

    def write(self, data: bytes | memoryview) -> int:
        # By position, not by bytes written: zipfile seeks back to rewrite its headers.
        if self._f.tell() + memoryview(data).nbytes > self._limit:
            raise _WroteTooMuch(f"the entry grew past the {self._limit:,} bytes it declared")
        return self._f.write(data)

    def __getattr__(self, name: str):  # seek, tell, flush: what zipfile and numpy ask for
        return getattr(self._f, name)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
