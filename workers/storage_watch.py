"""Keep a running program's use of the checkpoint store within its job's allowance.

A `command` program writes into its work folder, which lies on the checkpoint store, and every
job's checkpoints and results are written there too: a program that fills the store stalls
every GPU. No per-folder kernel quota exists everywhere (project quotas need XFS, or ext4
mounted with prjquota), so the worker measures, from a thread of its own while the program runs:

- **A walk** of the folder, never following a link, counts its entries (files, folders, links:
  each takes an inode) and their size. A regular file counts the larger of its apparent size
  (what a copy takes: a 3 GiB sparse file counts 3 GiB, although it has no blocks) and its
  allocated blocks (fallocate can allocate past a file's end). The walk stops as soon as it has
  seen too much, so a folder of millions of files costs no more than its limit.
- **The store's free space and free inodes**, with one statvfs every CHECK_EVERY_S: when either
  drops by more than a share of what the job has left, a write is under way and the walk runs
  at once; otherwise
  every WALK_EVERY_S, spaced further when walks are slow (a big folder), so that watching never
  takes more than a tenth of a core.
- **The reserve**: the store keeps CLOCKQ_STORE_RESERVE_PERCENT free for checkpoints and
  results; a job that grows into it is stopped like one over its allowance.

Passing a bound calls `on_over(reason)` once; the caller ends the program and fails the job
with that reason. How far a program can write past its bound is what it writes in one check's
time, at most a quarter of what it had left, plus CHECK_EVERY_S of its writing speed.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings

from clockq.jobs import quotas
from clockq.jobs.models import Job
from clockq.jobs.quotas import MB, Allowance

log = logging.getLogger("clockq.storage_watch")

CHECK_EVERY_S = 0.01  # a statvfs: microseconds, so a write is noticed within this
WALK_EVERY_S = 1.0
WALK_SHARE = 0.1  # the most of a core the walks may take: the next waits 1/WALK_SHARE its time
TRIGGER_SHARE = 0.25  # of what is left: a drop of the store's free space by this much walks now
MIN_TRIGGER_BYTES = 1 * MB
MIN_TRIGGER_FILES = 100


class JobStorage:
    """A claimed job's storage, as its workload sees it: what it may hold, and where to say
    what its work folder holds now (so that its owner's quota counts it while it runs)."""

    def __init__(self, job_id: int):
        self.job_id = job_id

    def allowance(self) -> tuple[Allowance, int]:
        """The job's allowance, and what it holds outside its work folder (checkpoints, result)."""
        checkpoint_bytes, result_bytes = (
            Job.objects.filter(pk=self.job_id).values_list("checkpoint_bytes", "result_bytes").get()
        )
        return quotas.allowance_of(self.job_id), quotas.KEPT_GENERATIONS * checkpoint_bytes + result_bytes

    def report(self, usage: Usage) -> None:
        Job.objects.filter(pk=self.job_id).update(work_bytes=usage.bytes, work_files=usage.files)


def unaccounted_allowance() -> Allowance:
    """The per-job caps alone, for a workload run outside a claim (no job, no owner)."""
    return Allowance(
        settings.CLOCKQ_JOB_STORAGE_MB * MB,
        f"the limit of {settings.CLOCKQ_JOB_STORAGE_MB:,} MB for one job (CLOCKQ_JOB_STORAGE_MB)",
        settings.CLOCKQ_JOB_FILES,
        f"the limit of {settings.CLOCKQ_JOB_FILES:,} files for one job (CLOCKQ_JOB_FILES)",
    )


@dataclass(frozen=True)
class Usage:
    bytes: int
    files: int
    complete: bool = True  # False: the walk stopped early, past a bound


def folder_usage(dir_fd: int, *, stop_bytes: int | None = None, stop_files: int | None = None) -> Usage:
    """What the folder open at `dir_fd` holds, links never followed. Stops as soon as `stop_bytes`
    or `stop_files` is passed (the usage then says at least that much)."""
    total_bytes = total_files = 0
    for _, dirs, files, fd in os.fwalk(dir_fd=dir_fd, follow_symlinks=False):
        for name in dirs + files:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed as we looked
            total_files += 1
            if stat.S_ISREG(st.st_mode):
                total_bytes += max(st.st_size, st.st_blocks * 512)
            if (stop_bytes is not None and total_bytes > stop_bytes) or (
                stop_files is not None and total_files > stop_files
            ):
                return Usage(total_bytes, total_files, complete=False)
    return Usage(total_bytes, total_files)


def store_room(path: str) -> tuple[int, int]:
    """The store's (free bytes for an unprivileged writer, reserve bytes)."""
    vfs = os.statvfs(path)
    size = vfs.f_blocks * vfs.f_frsize
    return vfs.f_bavail * vfs.f_frsize, int(size * settings.CLOCKQ_STORE_RESERVE_PERCENT / 100)


def _free_space(path: str) -> tuple[int, int]:
    """The store's free bytes and free inodes (0 where it does not count them)."""
    vfs = os.statvfs(path)
    return vfs.f_bavail * vfs.f_frsize, vfs.f_favail


class StorageWatch:
    """Watches one running program's work folder (open at `dir_fd`, on the store at `store`).

    `held_elsewhere`: what the job holds on the store outside the folder (its checkpoints and
    result), which its allowance covers too."""

    def __init__(
        self,
        dir_fd: int,
        store: str,
        allowance: Allowance,
        held_elsewhere: int,
        on_over: Callable[[str], None],
    ):
        self.dir_fd = dir_fd
        self.store = store
        self.allowance = allowance
        self.held_elsewhere = held_elsewhere
        self.on_over = on_over
        self.usage = Usage(0, 0)
        self.over = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._walk_gap_s = WALK_EVERY_S

    @property
    def max_folder_bytes(self) -> int:
        return max(0, self.allowance.max_bytes - self.held_elsewhere)

    def check(self) -> str:
        """Walk now: the reason the folder is over a bound, '' if it is not. Also in the thread."""
        started = time.monotonic()
        usage = folder_usage(self.dir_fd, stop_bytes=self.max_folder_bytes, stop_files=self.allowance.max_files)
        self._walk_gap_s = max(WALK_EVERY_S, (time.monotonic() - started) / WALK_SHARE)
        grew = usage.bytes - self.usage.bytes
        self.usage = usage
        reason = self.allowance.over(usage.bytes + self.held_elsewhere, usage.files)
        if not reason and grew > 0:
            free, reserve = store_room(self.store)
            if free < reserve:
                reason = (
                    f"the checkpoint store has {free / MB:,.1f} MB free, less than the "
                    f"{reserve / MB:,.1f} MB it keeps for every job's checkpoints and results "
                    f"(CLOCKQ_STORE_RESERVE_PERCENT), and the job's folder was still growing"
                )
        return reason

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="clockq-storage-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        try:
            self._watch()
        except OSError as exc:
            # The folder or the store cannot be read: the storage's problem, which the job's next
            # checkpoint meets and reports; watching stops rather than guess.
            log.warning("storage watch of %s stopped: %s", self.store, exc)

    def _watch(self) -> None:
        last_walk = 0.0
        free_then, inodes_then = _free_space(self.store)
        while not self._stop.is_set():
            now = time.monotonic()
            free, inodes = _free_space(self.store)
            # A drop counts from the most there was since the last walk.
            free_then, inodes_then = max(free_then, free), max(inodes_then, inodes)
            left = max(0, self.max_folder_bytes - self.usage.bytes)
            files_left = max(0, self.allowance.max_files - self.usage.files)
            trigger = max(MIN_TRIGGER_BYTES, int(min(left, free) * TRIGGER_SHARE))
            files_trigger = max(MIN_TRIGGER_FILES, int(files_left * TRIGGER_SHARE))
            writing = free_then - free > trigger or inodes_then - inodes > files_trigger
            if writing or now - last_walk >= self._walk_gap_s:
                reason = self.check()
                last_walk, free_then, inodes_then = time.monotonic(), free, inodes
                if reason:
                    self.over = reason
                    self.on_over(reason)
                    return
            self._stop.wait(CHECK_EVERY_S)
