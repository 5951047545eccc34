"""What a command job may hold on the checkpoint store, and what it holds: the allowance its
program, checkpoints and result share (per-job caps, what the owner's quota leaves, the store's
reserve), the watch that ends the program when it passes it, and the usage reported on the job
so that the owner's quota counts its work folder while it runs (workers/storage_watch.py)."""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from clockq.jobs import quotas
from clockq.jobs.quotas import Allowance
from workers.job_folder import JobFolder
from workers.storage_watch import JobStorage, StorageWatch, folder_usage, store_room, unaccounted_allowance
from workers.workloads.base import JobRefused

log = logging.getLogger(__name__)

USAGE_REPORT_EVERY_S = 1.0


class StorageLimitExceeded(JobRefused):
    """The program, its checkpoint or its result passed the job's storage allowance: the job
    fails at once, with the limit named; a retry would pass it again."""


class ProgramStorage:
    """The storage bounds of one job's program. `storage` is None where nothing accounts for
    the job (a workload run outside a worker): then only the per-job caps and the store bound it."""

    def __init__(self, storage: JobStorage | None, folder: JobFolder, work_dir: Path) -> None:
        self.storage = storage
        self.folder = folder
        self.work_dir = work_dir
        bounds: tuple[Allowance, int] = storage.allowance() if storage is not None else (unaccounted_allowance(), 0)
        self.allowance, self.held_elsewhere = bounds
        self.watch: StorageWatch | None = None
        self.over = ""  # why the watch ended the program, until taken
        self._reported: tuple[int, int] | None = None
        self._reported_at = 0.0

    def start_watch(self, stop_program: Callable[[], None]) -> None:
        """Watch the work folder from another thread while the program runs: passing the
        allowance records why and calls `stop_program` (from that thread)."""

        def passed(reason: str) -> None:
            self.over = reason
            stop_program()

        self.over = ""
        self.watch = StorageWatch(self.folder.fd, str(self.work_dir), self.allowance, self.held_elsewhere, passed)
        self.watch.start()

    def stop_watch(self) -> None:
        if self.watch is not None:
            self.watch.stop()
            self.watch = None

    def take_over(self) -> str:
        """Why the program was stopped for its storage ('' if it was not), once."""
        reason, self.over = self.over, ""
        return reason

    def report(self, force: bool = False) -> None:
        """What the work folder holds, on the job: at most once a USAGE_REPORT_EVERY_S while the
        program runs, and only when it changed; `force` measures and reports now."""
        usage = self.watch.usage if self.watch is not None else None
        now = time.monotonic()
        if not force and (usage is None or now - self._reported_at < USAGE_REPORT_EVERY_S):
            return
        if usage is None:
            # Stopped: measure once more, what it left is what it holds until retention.
            try:
                usage = folder_usage(
                    self.folder.fd, stop_bytes=self.allowance.max_bytes, stop_files=self.allowance.max_files
                )
            except OSError:
                return
        self._reported_at = now
        current = (usage.bytes, usage.files)
        if current != self._reported and self.storage is not None:
            self.storage.report(usage)
            self._reported = current

    def check_result_fits(self, nbytes: int) -> None:
        """StorageLimitExceeded when a result of `nbytes` passes what the job may store, or what
        the store could ever hold; ENOSPC (the store's fault: the job waits for room) when it
        does not fit in the store's free space now. Either way, before anything is copied."""
        mb = nbytes / quotas.MB
        if reason := self.allowance.over(self.held_elsewhere + nbytes, 0):
            raise StorageLimitExceeded(f"the result ({mb:,.1f} MB, apparent size) is refused: {reason}")
        free, reserve, size = store_space(self.work_dir)
        if nbytes > size - reserve:
            raise StorageLimitExceeded(
                f"the result ({mb:,.1f} MB, apparent size) is refused: larger than the checkpoint store "
                f"could ever hold ({size / quotas.MB:,.0f} MB, less its reserve, CLOCKQ_STORE_RESERVE_PERCENT)"
            )
        if nbytes > free - reserve:
            raise OSError(errno.ENOSPC, f"the result ({mb:,.1f} MB) does not fit in the store's free space now")

    def checkpoint_too_big(self, size: int) -> str:
        """Why a checkpoint of `size` bytes cannot be kept, '' when it can: the store keeps
        KEPT_GENERATIONS of it and the work folder one more, and writing it needs its size free."""
        held = quotas.KEPT_GENERATIONS * size
        if reason := self.allowance.over(held + size, 0):
            return reason
        free, reserve, _ = store_space(self.work_dir)
        if size > free - reserve:
            return (
                f"the checkpoint store has {free / quotas.MB:,.1f} MB free and keeps {reserve / quotas.MB:,.1f} MB "
                "of it for every job (CLOCKQ_STORE_RESERVE_PERCENT)"
            )
        return ""

    def clear_after_over(self, keep: tuple[str, ...], job_id: int) -> None:
        """What the program wrote is what passed the bound: gone with the job, so that the store
        keeps its room for everyone else (its checkpoints, in the store, are kept)."""
        try:
            self.folder.clear(keep=keep)
        except OSError as exc:
            log.warning("job %s: could not clear its work folder: %s", job_id, exc)
        self.report(force=True)


def store_space(path: Path) -> tuple[int, int, int]:
    """The store's free bytes, its reserve, and its size."""
    free, reserve = store_room(str(path))
    vfs = os.statvfs(path)
    return free, reserve, vfs.f_blocks * vfs.f_frsize
