"""A slice's boundary: what the policy decides from, read cheaply, and its decision.

It decides from the job's row, the broker's queue lengths and, only when those say someone
waits, the order in the database (clockq/jobs/order.py): whether a waiting job comes first and
this job is the one to make way for it. That read is made during the slice's last step, on the
runtime's reader thread, when the end could be foreseen, so the GPU does not wait for it; a
change signalled after it (an RT job, an operator's hold) still counts.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from django.db import connection as db_connection
from django.utils import timezone
from redis import RedisError

from clockq.bus import queues, signals
from clockq.bus.client import client
from clockq.jobs import hot_sql, order
from clockq.jobs.models import Job
from clockq.policy.slicing import Boundary, Decision, PendingAction, decide_at_boundary, ewma
from clockq.policy.states import JobState
from workers.run.checkpointer import Checkpointer
from workers.run.claim import ClaimedJob
from workers.run.errors import LostOwnership
from workers.run.tiers import RunTiers
from workers.runtime import Runtime

log = logging.getLogger("clockq.slices")


@dataclass(frozen=True)
class BoundaryRead:
    waiting: list[int]  # dispatch messages in the broker per tier rank, most urgent first
    row: dict[str, Any] | None  # the job's state, dispatch_token, pending_action and tier_id
    # The waiting job this one leaves its GPU to (clockq/jobs/order.py), read from the database
    # when the broker says someone waits: its description, or None.
    outranked_by: str | None = None
    # The next checkpoint's persist mark, set ahead when the read foresaw a yield: (name, when).
    marked: tuple[str, float] | None = None


def prefetch_lead_s(step_s: float, read_s: float, budget_s: float) -> float:
    """How long before a slice's end its boundary read starts: one step ahead (the last step),
    and at least twice the read's own time, so that a slice of short steps gets it done too; but
    not earlier than a quarter of the slice, so that a read that stalled once does not make every
    later decision stale."""
    return max(step_s, min(2 * read_s, budget_s / 4))


class SliceBoundary:
    """Where one claim of a job asks the policy whether to finish, continue or leave the GPU."""

    def __init__(self, job: ClaimedJob, runtime: Runtime, *, tiers: RunTiers, checkpoints: Checkpointer):
        self.job = job
        self.job_id = job.id
        self.token = job.dispatch_token
        self.runtime = runtime
        self.tiers = tiers
        self.checkpoints = checkpoints
        self.prefetch: Future[BoundaryRead] | None = None  # the boundary's read, made during the last step
        self.slice_ms = 0.0

    def new_slice(self, planned_ms: float) -> None:
        """A read made for an earlier slice is not this one's."""
        self.prefetch = None
        self.slice_ms = planned_ms  # the service this slice adds, as the order judges it

    def read_ahead(self) -> None:
        """Start the boundary's read on the reader thread, once a slice: the step loop calls this
        during what are likely the slice's last steps, so the GPU does not wait for it after them."""
        if self.prefetch is None:
            self.prefetch = self.runtime.boundary_reader.submit(self._prefetch_boundary)

    def decide(self, done: bool, cut_short: bool, used_ms: float) -> Decision:
        """The policy's decision at this boundary, after a slice that ran `used_ms`.
        LostOwnership if the job is no longer ours."""
        read = self._prefetched() if not (done or cut_short) else None
        if read is None:
            read = self._read_boundary(done, cut_short)
        self.checkpoints.marked_ahead = read.marked
        row, waiting = read.row, read.waiting
        if row is None or row["state"] != JobState.RUNNING or row["dispatch_token"] != self.token:
            raise LostOwnership(f"job is now {row['state'] if row else 'deleted'}")
        self.runtime.interrupts.clear(self.job_id)
        if row["tier_id"] != self.tiers.current.id:  # moved by an operator while running
            self.tiers.current = self.runtime.tiers.get(row["tier_id"])
        self.tiers.serve(used_ms, order.ladder())  # a promoted job served enough goes home
        return decide_at_boundary(
            Boundary(
                done=done,
                job_rank=self.tiers.current.rank,
                waiting_by_rank=waiting,
                outranked_by=read.outranked_by,
                pending_action=PendingAction(row["pending_action"]),
                past_deadline=bool(self.job.deadline and timezone.now() >= self.job.deadline),
                shutting_down=self.runtime.shutting_down(),
                cut_short=cut_short,
                checkpoints_failing=not done and self.runtime.checkpoints_failing(self.checkpoints.nbytes),
            )
        )

    def rt_wants_gpu(self) -> bool:
        """During a cold restore, which can wait seconds for another worker's persist of a big
        state, or a program's start: whether an RT job should have this GPU now, instead of
        after the restore and one step. Every busy GPU heard the RT signal; as at a step
        (`_waiting_by_rank`), the one that takes the RT job from the unclaimed count makes way,
        and the others go on (and forget the signal, which was answered)."""
        if not self.runtime.interrupts.rt_waits(self.tiers.current.rank):
            return False
        waiting = self._waiting_by_rank(self.tiers.home.rank, cut_short=True)  # [] if the broker is down
        if waiting and waiting[0]:
            return True
        self.runtime.interrupts.clear_rt()
        return False

    def _read_boundary(self, done: bool, cut_short: bool) -> BoundaryRead:
        """What a boundary decides from: the broker's queue lengths, the job's row, and, when
        the broker says someone waits, the order in the database (the broker may hold stale or
        duplicate messages, and knows nothing of service levels or shares)."""
        waiting = [] if done else self._waiting_by_rank(self.tiers.home.rank, cut_short)
        row = hot_sql.select_one(Job, self.job_id, ("state", "dispatch_token", "pending_action", "tier_id"))
        outranked_by = None
        if not cut_short and any(waiting):
            first = order.displacing(self.job_id, self.runtime.gpu_count(), serving_ms=self.slice_ms)
            outranked_by = order.describe(first) if first is not None else None
        return BoundaryRead(waiting, row, outranked_by)

    def _prefetch_boundary(self) -> BoundaryRead:
        """`_read_boundary` for a slice that ends on time, on the runtime's reader thread. When the
        read says the job will likely yield, the next checkpoint's persist mark is set here too,
        another round trip off the GPU's path (a mark for a checkpoint never named is ignored,
        and expires)."""
        try:
            began = time.perf_counter()
            read = self._read_boundary(done=False, cut_short=False)
            self.runtime.boundary_read_s = ewma(self.runtime.boundary_read_s, time.perf_counter() - began)
            if read.outranked_by is not None:
                name = self.checkpoints.next_name()
                if self.runtime.persister.mark(self.job_id, name):
                    read = replace(read, marked=(name, time.monotonic()))
            return read
        except Exception:
            db_connection.close()  # the reader thread's own connection: a broken one is not kept
            raise

    def _prefetched(self) -> BoundaryRead | None:
        """The read made during the last step, if it is done and nothing happened since that it
        could have missed: an RT job or an operator's change signals the worker, and then the
        boundary reads afresh. (A job of another tier queued during those last steps waits for the
        next boundary, as if it had come a little later.)"""
        prefetch, self.prefetch = self.prefetch, None
        if prefetch is None or not prefetch.done() or prefetch.exception() is not None:
            return None  # not done in time (the GPU does not wait for it), or it failed
        if self.runtime.interrupts.should_end_slice(self.job_id, self.tiers.current.rank):
            return None
        read = prefetch.result()
        if read.row is None or read.row["state"] != JobState.RUNNING or read.row["dispatch_token"] != self.token:
            return None  # the job is not ours any more: a decision that grave is made on a fresh read
        return read

    def _waiting_by_rank(self, rank: int, cut_short: bool = False) -> list[int]:
        """Jobs waiting per tier, from the broker's queue lengths: the cheap first look. When
        they say someone waits ahead, the database confirms it (`_read_boundary`).

        After an RT interrupt only RT counts, and only for the one busy GPU that takes the RT job
        from the counter of unclaimed ones (clockq/bus/signals.py): every busy GPU heard the signal,
        and one checkpoint per RT job is enough."""
        try:
            waiting = queues.waiting_by_rank()
        except RedisError as exc:
            # With the broker down nothing can be dispatched anyway: keep the GPU busy.
            log.warning("job %s: cannot read queue lengths (%s); continuing", self.job_id, exc)
            return []
        if cut_short:
            # Of all the busy GPUs that heard the RT signal, one per RT job makes way.
            if rank > 0 and waiting[0] and signals.take_rt_job(client()):
                self.runtime.made_way_for_rt = True
            else:
                waiting[0] = 0
        return waiting
