"""Claim a queued job for this worker: one compare-and-set from QUEUED to RUNNING.

A claim can also end the job instead (its deadline passed, or it waited past its tier's start
timeout), or leave it queued for another GPU (it does not fit in this one's free memory).

A claim starts from a dispatch message (`claim_job`), or from a hand-over (`take_handed_over`):
a job that has just left this GPU to a waiting job of its own tier, which the order gives this
GPU next, takes that job at once instead of waiting for the broker to deliver its message. The
message is not needed for the claim, which is the same compare-and-set on (QUEUED, dispatch
token): it stays in the broker as the fallback that another worker may take first. Whichever
claim commits first runs the job; the other finds it running, its message stale, and does
nothing.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from django.db.models import F
from django.utils import timezone
from redis import RedisError

from clockq.bus import counters, dispatch, queues, signals
from clockq.bus.client import client
from clockq.jobs import hot_sql, order
from clockq.jobs.models import Job
from clockq.jobs.transitions import transition
from clockq.policy import affinity, ordering
from clockq.policy.service_levels import WaitVerdict, judge_wait
from clockq.policy.states import JobState
from workers.lease import lease_until
from workers.runtime import Runtime
from workers.warm_cache import WARM_WAIT_S

log = logging.getLogger("clockq.slices")


@dataclass(frozen=True)
class ClaimedJob:
    """What a worker reads about a job when it claims it; the rest stays in the database."""

    id: int
    dispatch_token: str
    owner_id: int
    tier_id: int
    original_tier_id: int  # its own tier; differs while promoted
    workload: str
    params: dict[str, Any]
    deadline: datetime | None
    progress: float
    run_ms: int  # its service so far
    promoted_run_ms: int | None  # its service when it was promoted (None if it never was)
    level_from_ms: int  # its service when its level began to count (a batch chance), else 0
    checkpoint_generation: int  # the highest ever named
    checkpoint_files: list[str]  # what to restore from, newest first
    checkpoint_bytes: int
    util_ewma: float | None
    switch_cost_ms: float | None
    storage_faults: int  # met while the store took other writes (Runtime.count_storage_fault)

    FIELDS: ClassVar[tuple[str, ...]] = (
        "id",
        "dispatch_token",
        "owner_id",
        "tier_id",
        "original_tier_id",
        "workload",
        "params",
        "deadline",
        "progress",
        "run_ms",
        "promoted_run_ms",
        "level_from_ms",
        "checkpoint_generation",
        "checkpoint_files",
        "checkpoint_bytes",
        "util_ewma",
        "switch_cost_ms",
        "storage_faults",
    )


_CLAIM_ONLY_FIELDS = ("state", "enqueued_at", "submitted_at", "first_started_at", "late_at", "gpu_mem_mib", "worker")


def claim_job(job_id: int, token: str, runtime: Runtime) -> ClaimedJob | None:
    """Take a queued job for this worker: the one that comes first in the order
    (clockq/jobs/order.py), which the message woke this worker for. None if the message is
    stale, or the job cannot run here (its deadline passed, or it does not fit in this GPU's
    free memory)."""
    row = _queued_row(job_id, token)
    if row is None:
        log.info("job %s: dropping stale message (token %s)", job_id, token[:8])
        return None
    best = order.next_for_gpu(runtime.gpu_count())
    if best is not None and best.standing.job_id != job_id:
        other = _queued_row(best.standing.job_id, best.token)
        claimed = _claim_row(other, runtime) if other is not None else None
        if claimed is not None:
            # The message's own job is still queued and needs its wake-up back. Not announced
            # again: its dispatch was, and the claim of an urgent job announces the urgent jobs
            # still waiting (`_announce_urgent_left`).
            _send_again(job_id, token, runtime.stores.tiers.get(row["tier_id"]).queue_name)
            return claimed
        # Another worker took it first, or it ended or stayed queued at its claim: take ours.
        row = _queued_row(job_id, token)
        if row is None:
            return None
    return _claim_row(row, runtime)


def take_handed_over(to: order.Waiting, runtime: Runtime, *, best: order.Waiting | None = None) -> ClaimedJob | None:
    """The hand-over: this GPU's job has just yielded it to `to`. Claim `to` here, if it is
    still the job a free GPU takes (`order.next_for_gpu`: the policy's choice, as for a claim
    from a message); None if not, or if another worker claimed it first, and then the broker's
    message wakes whoever takes it. Once claimed, its message is withdrawn from its queue, off
    the GPU's path (`_withdraw_wake_up`). `best`: the order just read, if it was."""
    best = best or order.next_for_gpu(runtime.gpu_count())
    if best is None or best.standing.job_id != to.standing.job_id:
        return None
    row = _queued_row(best.standing.job_id, best.token)
    claimed = _claim_row(row, runtime) if row is not None else None
    if claimed is None:
        return None
    queue = runtime.stores.tiers.get(row["tier_id"]).queue_name  # type: ignore[index]
    runtime.threads.boundary_reader.submit(_withdraw_wake_up, claimed.id, claimed.dispatch_token, queue)
    log.debug("job %s: handed over on %s", claimed.id, runtime.identity.hostname)
    return claimed


def take_warm_next(runtime: Runtime) -> ClaimedJob | None:
    """A GPU whose job has just ended or left it: if the job a free GPU takes next
    (`order.next_for_gpu`) is one this worker holds warm (workers/warm_cache.py), claim it here
    at once, as a hand-over does. Another GPU that took its message leaves it to this one for a
    bounded time (`_leave_to_warm_worker`), and cannot wake this one meanwhile. None if not."""
    if not len(runtime.stores.warm):
        return None
    best = order.next_for_gpu(runtime.gpu_count())
    if best is None or best.standing.job_id not in runtime.stores.warm:
        return None
    return take_handed_over(best, runtime, best=best)


# How far from the delivering end of a queue a handed-over job's message is looked for.
WITHDRAW_SCAN = 500


def _withdraw_wake_up(job_id: int, token: str, queue_name: str) -> bool:
    """Remove the message of a job claimed by a hand-over from its queue, if it is still there
    (a worker may have taken it already, and will find it stale): left there, it would count as
    a waiting job at every boundary until a worker took it and dropped it. Best effort: one left
    behind (the broker failed, or it sits deeper than WITHDRAW_SCAN in a long queue) is only a
    stale message. Whether one was removed."""
    try:
        r = client()
        for raw in reversed(r.lrange(queue_name, -WITHDRAW_SCAN, -1)):  # the oldest first
            if queues.parse_dispatch(raw) == (job_id, token):
                return bool(r.lrem(queue_name, 1, raw))  # type: ignore[arg-type]
    except RedisError as exc:
        log.info("job %s: its handed-over message stays in %s (%s)", job_id, queue_name, exc)
    return False


def claim_message_job(job_id: int, token: str, runtime: Runtime) -> ClaimedJob | None:
    """Claim the message's own job and no other: a GPU's RT lane (workers/rt_lane.py) takes only
    the RT jobs its queue wakes it for, not what the order would give a whole GPU."""
    row = _queued_row(job_id, token)
    return _claim_row(row, runtime) if row is not None else None


def give_back(job_id: int, token: str, runtime: Runtime) -> None:
    """Put a message this worker will not act on back in its queue, if its job still waits on it."""
    row = _queued_row(job_id, token)
    if row is not None:
        _send_again(job_id, token, runtime.stores.tiers.get(row["tier_id"]).queue_name)


def _queued_row(job_id: int, token: str) -> dict[str, Any] | None:
    row = hot_sql.select_one(Job, job_id, (*ClaimedJob.FIELDS, *_CLAIM_ONLY_FIELDS))
    if row is None or row["state"] != JobState.QUEUED or row["dispatch_token"] != token:
        return None
    return row


def _send_again(job_id: int, token: str, queue_name: str) -> None:
    try:
        dispatch.send_run_slice(job_id, token, queue_name)
    except Exception as exc:  # the broker may be down: the job is queued, the reconciler resends
        log.warning("job %s: could not send its wake-up again (%s); the reconciler will", job_id, exc)


def _claim_row(row: dict[str, Any], runtime: Runtime) -> ClaimedJob | None:
    """The claim's compare-and-set from QUEUED to RUNNING on a row just read, or its end."""
    job_id, token = row["id"], row["dispatch_token"]
    now = timezone.now()
    worker = runtime.identity
    if row["deadline"] and now >= row["deadline"]:
        transition(
            job_id,
            to=JobState.TIMED_OUT,
            expect={JobState.QUEUED},
            token=token,
            reason="deadline passed before the job could start",
            actor=worker.hostname,
            updates={"finished_at": now},
        )
        return None
    first_start: dict[str, Any] = {}
    if row["first_started_at"] is None:
        # Its first start: judged against its own tier's service levels, as the SLO check does.
        home = runtime.stores.tiers.get(row["original_tier_id"])
        first_wait_ms = max(int((now - row["submitted_at"]).total_seconds() * 1000), 0)
        verdict = judge_wait(first_wait_ms, target_ms=home.wait_target_ms, start_timeout_ms=home.start_timeout_ms)
        if verdict == WaitVerdict.TIMED_OUT:
            transition(
                job_id,
                to=JobState.TIMED_OUT,
                expect={JobState.QUEUED},
                token=token,
                reason=f"not started within {home.code}'s start timeout of {home.start_timeout_ms} ms "
                f"(claimed after {first_wait_ms} ms)",
                actor=worker.hostname,
                updates={"finished_at": now},
            )
            return None
        first_start = {"first_started_at": now, "first_wait_ms": first_wait_ms}
        if verdict == WaitVerdict.LATE and row["late_at"] is None:
            first_start["late_at"] = now
    if not _fits(job_id, token, row["gpu_mem_mib"], runtime):
        return None
    if _leave_to_warm_worker(row, runtime):
        return None
    waited_ms = max(int((now - row["enqueued_at"]).total_seconds() * 1000), 0) if row["enqueued_at"] else 0
    changed = transition(
        job_id,
        to=JobState.RUNNING,
        expect={JobState.QUEUED},
        token=token,
        reason=f"claimed on GPU {worker.gpu_index}",
        actor=worker.hostname,
        updates={
            "worker": worker.hostname,
            "wait_ms": F("wait_ms") + waited_ms,
            **first_start,
            "lease_expires_at": lease_until(),
            "slice_started_at": now,
            "placement_note": "",
        },
    )
    if changed is None:
        return None
    if ordering.interrupts(runtime.stores.tiers.get(row["tier_id"]).rank):
        runtime.threads.boundary_reader.submit(_announce_urgent_left)
    if first_start:
        counters.count_first_start(
            tier=home.code, wait_ms=first_start["first_wait_ms"], writer=runtime.threads.boundary_reader
        )
    return ClaimedJob(**{name: row[name] for name in ClaimedJob.FIELDS})


def _announce_urgent_left() -> None:
    """After the claim of an urgent job (off the claim's path): if more urgent jobs wait, say so
    again. A look at a boundary names one victim, for the first waiting job, and none while a
    GPU is free; a burst of urgent jobs gets its next victim once this GPU is taken."""
    try:
        waiting = queues.waiting_by_rank()
    except RedisError:
        return  # a lost announcement only leaves it to the ordinary boundaries
    urgent = [rank for rank, n in enumerate(waiting) if n and ordering.interrupts(rank)]
    if urgent:
        signals.announce_urgent(client(), min(urgent))


def _fits(job_id: int, token: str, need_mib: int | None, runtime: Runtime) -> bool:
    """Whether the job's declared GPU memory fits in this GPU's free memory right now. If not,
    the job stays queued with the reason on it; the reconciler sends it out again after its
    grace period, so another GPU (or this one, once free) can take it."""
    if not need_mib:
        return True
    free = runtime.threads.probe.free_memory_mib()
    if free is None or free >= need_mib:
        return True
    note = f"needs {need_mib} MiB of GPU memory; {runtime.identity.hostname} had {free} MiB free"
    Job.objects.filter(pk=job_id, state=JobState.QUEUED, dispatch_token=token).update(placement_note=note[:300])
    log.info("job %s: %s; leaving it queued", job_id, note)
    return False


# How often a GPU that leaves a job to its warm worker looks whether it took it: a read each time,
# so not too often; finding out late only delays this GPU's giving up, not the job.
WARM_POLL_S = 0.02


def _leave_to_warm_worker(row: dict[str, Any], runtime: Runtime) -> bool:
    """Whether the job went to the worker that holds it warm while this free GPU left it to
    that one (`affinity.wait_for_warm_s`: only while that worker is busy, and for a bounded time
    since the job was queued). False: this GPU claims it, cold."""
    warm, me = row["worker"], runtime.identity.hostname
    if not warm or warm == me or not row["checkpoint_files"] or WARM_WAIT_S <= 0:
        return False
    busy = Job.objects.filter(state=JobState.RUNNING, worker=warm).exists()  # one indexed read, not the order
    queued_for_s = (timezone.now() - row["enqueued_at"]).total_seconds() if row["enqueued_at"] else math.inf
    wait_s = affinity.wait_for_warm_s(
        this_worker=me, warm_worker=warm, warm_worker_busy=busy, queued_for_s=queued_for_s, bound_s=WARM_WAIT_S
    )
    until = time.monotonic() + wait_s
    while time.monotonic() < until:
        time.sleep(min(WARM_POLL_S, max(until - time.monotonic(), 0.0)))
        if _queued_row(row["id"], row["dispatch_token"]) is None:
            log.info("job %s: left to %s, which holds it warm", row["id"], warm)
            return True
    return False
