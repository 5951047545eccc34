"""Per-user limits: how many jobs may wait or run at once, and how much storage a user's jobs
may hold: their checkpoints, their results and, while they run, their work folders (bytes and
files). The defaults are settings; the admin can set others per user. One job may also hold at
most CLOCKQ_JOB_STORAGE_MB and CLOCKQ_JOB_FILES, whatever its owner's quota leaves."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Q, Sum

from clockq.jobs import hot_sql
from clockq.jobs.models import Job, UserQuota
from clockq.policy.states import JobState

MB = 10**6
ACTIVE = (JobState.QUEUED, JobState.RUNNING, JobState.HELD)
KEPT_GENERATIONS = 2  # the checkpoint store keeps this many per job


class QuotaExceeded(Exception):
    """A user's limit would be passed. The message says which, by how much, and who can help."""


@dataclass(frozen=True)
class Limits:
    max_active_jobs: int
    max_checkpoint_bytes: int
    max_files: int = 0


def limits_of(user) -> Limits:
    row = UserQuota.objects.filter(user=user).first()
    return _limits(row and row.max_active_jobs, row and row.max_checkpoint_mb, row and row.max_files)


def _limits(max_active_jobs: int | None, max_checkpoint_mb: int | None, max_files: int | None = None) -> Limits:
    """A user's own limits where set (UserQuota), the defaults from settings where not."""
    jobs = max_active_jobs if max_active_jobs is not None else settings.CLOCKQ_QUOTA_ACTIVE_JOBS
    mb = max_checkpoint_mb if max_checkpoint_mb is not None else settings.CLOCKQ_QUOTA_CHECKPOINT_MB
    files = max_files if max_files is not None else settings.CLOCKQ_QUOTA_FILES
    return Limits(jobs, mb * MB, files)


def checkpoint_bytes_of(owner_id: int, *, excluding_job: int | None = None) -> int:
    """Storage a user's jobs hold now, as clockq accounts it: the checkpoints (two generations of
    each job's newest), the results of finished jobs and the work folders."""
    return _usage_of(owner_id, excluding_job)[0]


def files_of(owner_id: int) -> int:
    """Files a user's jobs hold in their work folders, as the workers last measured them."""
    return _usage_of(owner_id, None)[1]


def _usage_of(owner_id: int, excluding_job: int | None) -> tuple[int, int]:
    """The bytes (as checkpoint_bytes_of counts them) and work-folder files a user's jobs hold."""
    jobs = Job.objects.filter(
        Q(checkpoint_bytes__gt=0) | Q(result_bytes__gt=0) | Q(work_bytes__gt=0), owner_id=owner_id
    )
    if excluding_job is not None:
        jobs = jobs.exclude(pk=excluding_job)
    totals = jobs.aggregate(**_STORAGE)
    held = _held(totals["checkpoints"] or 0, totals["results"] or 0, totals["work"] or 0)
    return held, totals["files"] or 0


# What checkpoint_bytes_of sums.
_STORAGE = {
    "checkpoints": Sum("checkpoint_bytes"),
    "results": Sum("result_bytes"),
    "work": Sum("work_bytes"),
    "files": Sum("work_files"),
}


def _held(checkpoint_bytes: int, result_bytes: int, work_bytes: int = 0) -> int:
    return KEPT_GENERATIONS * checkpoint_bytes + result_bytes + work_bytes


@dataclass(frozen=True)
class Allowance:
    """What one job may hold on the store now (its work folder, its checkpoints and its result
    together), in bytes and in files, and which limit sets each: for the reason a job is
    stopped with when it passes one."""

    max_bytes: int
    bytes_limit: str
    max_files: int
    files_limit: str

    def over(self, used_bytes: int, used_files: int) -> str:
        """Why `used_bytes`/`used_files` pass this allowance, in words; '' when they do not."""
        if used_bytes > self.max_bytes:
            return f"the job holds {used_bytes / MB:,.1f} MB on the checkpoint store, over {self.bytes_limit}"
        if used_files > self.max_files:
            return f"the job holds {used_files:,} files on the checkpoint store, over {self.files_limit}"
        return ""


def allowance_of(job_id: int) -> Allowance:
    """The tighter, for each of bytes and files, of the per-job cap and what the owner's quota
    leaves once the owner's other jobs are counted."""
    owner_id = Job.objects.filter(pk=job_id).values_list("owner_id", flat=True).get()
    owner = get_user_model().objects.get(pk=owner_id)
    limits = limits_of(owner)
    others_bytes, others_files = _usage_of(owner_id, job_id)
    job_cap = settings.CLOCKQ_JOB_STORAGE_MB * MB
    left = max(0, limits.max_checkpoint_bytes - others_bytes)
    quota_words = (
        f"what {owner.get_username()}'s storage quota of {limits.max_checkpoint_bytes / MB:,.0f} MB leaves "
        f"({left / MB:,.1f} MB; their other jobs hold the rest)"
    )
    max_bytes, bytes_limit = min(
        (job_cap, f"the limit of {job_cap / MB:,.0f} MB for one job (CLOCKQ_JOB_STORAGE_MB)"),
        (left, quota_words),
    )
    files_left = max(0, limits.max_files - others_files)
    max_files, files_limit = min(
        (settings.CLOCKQ_JOB_FILES, f"the limit of {settings.CLOCKQ_JOB_FILES:,} files for one job (CLOCKQ_JOB_FILES)"),
        (files_left, f"what {owner.get_username()}'s quota of {limits.max_files:,} files leaves ({files_left:,})"),
    )
    return Allowance(max_bytes, bytes_limit, max_files, files_limit)


def check_submit(user, declared_state_bytes: int = 0, count: int = 1) -> None:
    """Raise QuotaExceeded if `user` may not submit `count` more jobs now, together declaring
    `declared_state_bytes` of state (a batch is checked as a whole, not job by job)."""
    # A submit's hot path: one statement (hot_sql.quota_read), whose reads do not grow with the
    # owner's history. The storage is what checkpoint_bytes_of sums.
    read = hot_sql.quota_read(user.pk, ACTIVE, settings.CLOCKQ_QUOTA_ACTIVE_JOBS)
    limits = _limits(read.max_active_jobs, read.max_checkpoint_mb)
    active = read.active
    if active + count > limits.max_active_jobs:
        more = "" if count == 1 else f" and this batch would add {count}"
        has = active if active <= limits.max_active_jobs else f"more than {limits.max_active_jobs}"
        raise QuotaExceeded(
            f"quota: {user.get_username()} already has {has} queued, running or held jobs{more}, "
            f"the most allowed ({limits.max_active_jobs}); wait for some to finish, or ask an operator"
        )
    used = _held(read.checkpoint_bytes, read.result_bytes, read.work_bytes)
    needed = used + KEPT_GENERATIONS * declared_state_bytes
    if needed > limits.max_checkpoint_bytes:
        raise QuotaExceeded(
            f"quota: {user.get_username()}'s jobs hold {used / MB:.0f} MB of storage and this one would need "
            f"{KEPT_GENERATIONS * declared_state_bytes / MB:.0f} MB more, over the limit of "
            f"{limits.max_checkpoint_bytes / MB:.0f} MB; finished jobs' checkpoints are deleted after "
            f"{settings.CLOCKQ_CHECKPOINT_RETENTION_S // 3600} h"
        )


def check_checkpoint(job_id: int, owner_id: int, new_bytes: int) -> None:
    """Raise QuotaExceeded if keeping a checkpoint of `new_bytes` for this job would put its owner
    over their storage limit."""
    job_cap = settings.CLOCKQ_JOB_STORAGE_MB * MB
    if KEPT_GENERATIONS * new_bytes > job_cap:
        raise QuotaExceeded(
            f"quota: a checkpoint of {new_bytes / MB:.1f} MB, kept in {KEPT_GENERATIONS} generations, is over the "
            f"limit of {job_cap / MB:,.0f} MB for one job (CLOCKQ_JOB_STORAGE_MB)"
        )
    owner = get_user_model().objects.get(pk=owner_id)
    limits = limits_of(owner)
    others = checkpoint_bytes_of(owner_id, excluding_job=job_id)
    if others + KEPT_GENERATIONS * new_bytes > limits.max_checkpoint_bytes:
        raise QuotaExceeded(
            f"quota: a checkpoint of {new_bytes / MB:.1f} MB would put {owner.get_username()}'s checkpoint "
            f"storage at {(others + KEPT_GENERATIONS * new_bytes) / MB:.0f} MB, over the limit of "
            f"{limits.max_checkpoint_bytes / MB:.0f} MB"
        )
