"""A slice's boundary: what the policy decides from, read cheaply, and its decision.

It decides from the job's row, the broker's queue lengths and, only when those say someone
waits, the order in the database (clockq/jobs/order.py): whether a waiting job comes first and
this job is the one to make way for it. That read is made during the slice's last step, on the
runtime's reader thread, when the end could be foreseen, so the GPU does not wait for it; a
change signalled after it (an urgent job, an operator's hold) still counts.

An urgent job (a tier that interrupts: RT, HP) is announced to every busy GPU. One whose job it
could displace looks at its next step (`interrupted`): the same read and the same question, so
the policy's victim leaves (for RT the cheapest switch), and every other GPU goes on within the
same slice, having written nothing.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.db import connection as db_connection
from django.utils import timezone
from redis import RedisError

from clockq.bus import free_gpus, queues
from clockq.bus.queues import BrokerView
from clockq.jobs import hot_sql, order
from clockq.jobs.models import Job
from clockq.policy import ordering
from clockq.policy.lanes import lanes_take_urgent
from clockq.policy.slicing import Boundary, BoundaryAction, Decision, PendingAction, decide_at_boundary, ewma
from clockq.policy.states import JobState
from workers.run.checkpointer import Checkpointer
from workers.run.claim import ClaimedJob
from workers.run.errors import LostOwnership
from workers.run.tiers import RunTiers
from workers.runtime import Runtime

log = logging.getLogger("clockq.slices")

# A job named to make way for an urgent job leaves at its next step, a few to a few hundred ms
# away. One that has not after this long is passed over (`SliceBoundary._look`): an RT job's
# start timeout is 1 s, and a dead worker's job stays running until the reaper takes it back.
UNRESPONSIVE_S = 0.25
MAX_PASSED_OVER = 2


@dataclass(frozen=True)
class BoundaryRead:
    waiting: list[int]  # dispatch messages in the broker per tier rank, most urgent first
    row: dict[str, Any] | None  # the job's state, dispatch_token, pending_action and tier_id
    # The waiting job this one leaves its GPU to (clockq/jobs/order.py), read from the database
    # when the broker says someone waits: its description, or None.
    outranked_by: str | None = None
    # The next checkpoint's persist mark, set ahead when the read foresaw a yield: (name, when).
    marked: tuple[str, float] | None = None
    # This GPU was marked free ahead, with the read that foresaw the yield (clockq/bus/free_gpus.py).
    freed_ahead: bool = False
    # The waiting job itself (`outranked_by` describes it), for a hand-over (`claim.take_handed_over`).
    mine: order.Waiting | None = None


# How long a boundary waits for its read made during the last step to finish, before it reads
# afresh (a read that stalls this long is stuck on the database or the broker).
PREFETCH_WAIT_S = 0.05


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
        self.slice_ms = 0.0  # the service this slice adds, as the order judges it
        self.planned_s = math.inf  # the planned slice; none yet during the restore
        self.claimed_at = time.monotonic()  # when the job got this GPU
        self.run_ms = float(job.run_ms)  # its service, this claim's slices included
        self.looked: BoundaryRead | None = None  # an urgent job's look that named a job to make way for
        self.relook_at: float | None = None  # (monotonic) when to look once more (`_look`)
        # Another GPU's job that a look named to make way, and when (monotonic); the jobs that
        # were named and did not make way in time, passed over since (`_look`).
        self.awaited: tuple[int, float] | None = None
        self.passed_over: set[int] = set()
        # The waiting job the last decision left the GPU to, for the order: what a hand-over takes.
        self.made_way_to: order.Waiting | None = None
        self.lane_leave: str | None = None  # an RT job in the GPU's lane this job leaves for (`make_way_for_lane`)
        self.left_for_lane = False  # and it did, in this run: its GPU memory is the RT job's
        # A GPU's RT lane runs RT jobs only, beside the GPU's own job: no job of the order takes
        # its place (and RT never displaces RT), so its jobs make way for no one.
        self.in_lane = runtime.identity.lane_of is not None

    def new_slice(self, planned_ms: float) -> None:
        """A read made for an earlier slice is not this one's."""
        self.prefetch = None
        self.slice_ms = planned_ms
        self.planned_s = planned_ms / 1000

    def read_ahead(self) -> None:
        """Start the boundary's read on the reader thread, once a slice: the step loop calls this
        during what are likely the slice's last steps, so the GPU does not wait for it after them."""
        if self.prefetch is None:
            self.prefetch = self.runtime.boundary_reader.submit(self._prefetch_boundary)

    def interrupted(self, serving_ms: float) -> bool:
        """At a step (or during a restore): whether an urgent job takes this GPU now. Almost
        free unless one was announced that could displace this job (`ordering.may_interrupt`);
        then this is the boundary's own read and question (`_look`), `serving_ms` being the
        slice's service so far. True only if the order names a waiting job to make way for now;
        the boundary then decides from that read. Otherwise the slice goes on as it was."""
        rank = self.runtime.interrupts.take_urgent()
        if self.in_lane:
            return False
        relook = False
        if rank is None:
            if self.relook_at is None or time.monotonic() < self.relook_at:
                return False
            self.relook_at, relook = None, True
        elif not ordering.may_interrupt(rank, self._standing(serving_ms)):
            return False
        return self._look(serving_ms, relook=relook)

    def urgent_takes_gpu(self) -> bool:
        """During a cold restore, which can wait seconds for another worker's persist of a big
        state, or a program's start: whether an urgent job takes this GPU now, instead of after
        the restore and one step. The same look as at a step (`interrupted`)."""
        return self.interrupted(serving_ms=0.0)

    def make_way_for_lane(self, why: str) -> None:
        """The slice ended at a step because an RT job in this GPU's lane needs the room
        (workers/rt_lane.py): the boundary makes way for it through the checkpoint path."""
        self.lane_leave = why
        self.left_for_lane = True

    def decide(self, done: bool, cut_short: bool, used_ms: float) -> Decision:
        """The policy's decision at this boundary, after a slice that ran `used_ms`.
        LostOwnership if the job is no longer ours."""
        self.slice_ms = used_ms
        read, self.looked = self.looked, None
        if read is None and not (done or cut_short):
            read = self._prefetched()
        if read is None:
            read = self._read_boundary(done, cut_short)
        if self.lane_leave is not None:
            read, self.lane_leave = replace(read, outranked_by=read.outranked_by or self.lane_leave), None
        self.checkpoints.marked_ahead = read.marked
        row = read.row
        if row is None or row["state"] != JobState.RUNNING or row["dispatch_token"] != self.token:
            raise LostOwnership(f"job is now {row['state'] if row else 'deleted'}")
        self.runtime.interrupts.clear(self.job_id)
        if row["tier_id"] != self.tiers.current.id:  # moved by an operator while running
            self.tiers.current = self.runtime.tiers.get(row["tier_id"])
        self.run_ms += used_ms
        self.tiers.serve(used_ms, order.ladder())  # a promoted job served enough goes home
        boundary = Boundary(
            done=done,
            outranked_by=read.outranked_by,
            pending_action=PendingAction(row["pending_action"]),
            past_deadline=bool(self.job.deadline and timezone.now() >= self.job.deadline),
            shutting_down=self.runtime.shutting_down(),
            cut_short=cut_short,
            checkpoints_failing=not done and self.runtime.checkpoints_failing(self.checkpoints.nbytes),
        )
        decision = decide_at_boundary(boundary)
        for_the_order = boundary.pending_action == PendingAction.NONE and not boundary.shutting_down
        self.made_way_to = read.mine if decision.action == BoundaryAction.YIELD and for_the_order else None
        if decision.action != BoundaryAction.CONTINUE and not read.freed_ahead:
            self.runtime.leave_gpu()  # before the write that frees it: see clockq/bus/free_gpus.py
        return decision

    def _look(self, serving_ms: float, *, relook: bool) -> bool:
        """An urgent job was announced: is this the GPU it takes? The cheap first look is the
        broker's: if no message of a tier that interrupts is there any more, a free GPU took it
        (or it was answered already), and that costs one round trip to Redis. Otherwise the order
        decides, as at any boundary (`order.make_way`).

        Every busy GPU that the announced job could displace looks once per announcement: one
        round trip to Redis and, while an urgent message waits, the order's two statements (the
        queue heads and the running jobs, which is what each of their next boundaries reads
        anyway); the one that makes way reads its row too. A GPU looks once more, at most twice
        per announcement:

        - when the look went on while a GPU counted as free (clockq/bus/free_gpus.py), once that
          GPU no longer counts, so that a worker that died just after it left a job holds an
          urgent job back by at most FREE_S;
        - when the look named another GPU's job to make way, UNRESPONSIVE_S later: if the urgent
          job still waits and that job is still named, its worker died or hangs in a long step
          (a dead worker's job stays running until the reaper takes it back, 20 s later), and it
          is passed over, so that the next victim makes way. Up to MAX_PASSED_OVER jobs are."""
        view = self._broker_view()
        if not any(n for rank, n in enumerate(view.waiting) if ordering.interrupts(rank)):
            self.awaited, self.passed_over = None, set()
            return False
        if lanes_take_urgent(view.waiting, view.idle_lanes):
            return False  # idle RT lanes take them, pausing jobs in place (workers/rt_lane.py)
        try:
            way = self._make_way(view, serving_ms)
            if way.mine is None and self._overdue(way.victim_id):
                self.passed_over.add(way.victim_id)  # type: ignore[arg-type]
                log.warning(
                    "job %s was named to make way for an urgent job and has not in %.2f s; passed over",
                    way.victim_id,
                    UNRESPONSIVE_S,
                )
                way = self._make_way(view, serving_ms)
            row = self._row() if way.mine is not None else None
        except DatabaseError as exc:
            # Not the job's failure (this runs inside the step loop's workload errors): its
            # boundary reads the database again, and meets the fault there.
            log.warning("job %s: cannot read the order for an urgent job (%s); going on", self.job_id, exc)
            return False
        if way.mine is None:
            self._await(way.victim_id)
            if self.relook_at is None and view.freed and not relook:
                self.relook_at = time.monotonic() + free_gpus.FREE_S
            return False
        self.looked = BoundaryRead(view.waiting, row, order.describe(way.mine), mine=way.mine)
        return True

    def _make_way(self, view: BrokerView, serving_ms: float) -> order.MakeWay:
        return order.make_way(
            self.job_id,
            freed=view.freed,
            serving_ms=serving_ms,
            held_s=self._held_s(),
            slice_s=self.planned_s,
            passed_over=self.passed_over,
        )

    def _await(self, victim_id: int | None) -> None:
        """Another GPU's job was named to make way: look again if it has not in UNRESPONSIVE_S."""
        if victim_id is None or victim_id == self.job_id or len(self.passed_over) >= MAX_PASSED_OVER:
            self.awaited = None
            return
        if self.awaited is None or self.awaited[0] != victim_id:
            self.awaited = (victim_id, time.monotonic())
        self.relook_at = self.awaited[1] + UNRESPONSIVE_S

    def _overdue(self, victim_id: int | None) -> bool:
        """Whether `victim_id` was named before and has had UNRESPONSIVE_S to make way."""
        awaited = self.awaited
        return (
            victim_id is not None
            and awaited is not None
            and awaited[0] == victim_id
            and time.monotonic() >= awaited[1] + UNRESPONSIVE_S
            and len(self.passed_over) < MAX_PASSED_OVER
        )

    def _standing(self, serving_ms: float) -> ordering.Standing:
        """This job as the order sees it now, its service in this slice so far included."""
        served = self.run_ms - self.tiers.level_from_ms + serving_ms  # since a batch chance, else all
        rank = self.tiers.current.rank
        return ordering.Standing(
            rank=rank,
            level=order.ladder().level(rank, served / 1000),
            user_share_gpu_s=0.0,
            submitted=float(self.job_id),
            job_id=self.job_id,
            promoted=self.tiers.promoted,
        )

    def _held_s(self) -> float:
        return time.monotonic() - self.claimed_at

    def _row(self) -> dict[str, Any] | None:
        return hot_sql.select_one(Job, self.job_id, ("state", "dispatch_token", "pending_action", "tier_id"))

    def _read_boundary(self, done: bool, cut_short: bool) -> BoundaryRead:
        """What a boundary decides from: the broker's queue lengths, the job's row, and, when
        the broker says someone waits, the order in the database (the broker may hold stale or
        duplicate messages, and knows nothing of service levels or shares). A slice cut short
        has not had its planned time: it leaves only when `ordering.leaves_at` says so."""
        view = BrokerView() if done else self._broker_view()
        row = self._row()
        outranked_by, first = None, None
        if any(view.waiting) and not self.in_lane:
            first = order.displacing(
                self.job_id,
                freed=view.freed,
                serving_ms=self.slice_ms,
                held_s=self._held_s() if cut_short else None,
                slice_s=self.planned_s,
            )
            outranked_by = order.describe(first) if first is not None else None
        return BoundaryRead(view.waiting, row, outranked_by, mine=first)

    def _prefetch_boundary(self) -> BoundaryRead:
        """`_read_boundary` for a slice that ends on time, on the runtime's reader thread. When the
        read says the job will likely yield, the next checkpoint's persist mark and this GPU's
        free mark are set here too, more round trips off the GPU's path (a persist mark for a
        checkpoint never named is ignored, and expires; a free mark counts only once the job has
        left the GPU)."""
        try:
            began = time.perf_counter()
            read = self._read_boundary(done=False, cut_short=False)
            self.runtime.boundary_read_s = ewma(self.runtime.boundary_read_s, time.perf_counter() - began)
            if read.outranked_by is not None:
                name = self.checkpoints.next_name()
                if self.runtime.persister.mark(self.job_id, name):
                    read = replace(read, marked=(name, time.monotonic()))
                read = replace(read, freed_ahead=self.runtime.leave_gpu())
            return read
        except Exception:
            db_connection.close()  # the reader thread's own connection: a broken one is not kept
            raise

    def _prefetched(self) -> BoundaryRead | None:
        """The read made during the last step, once it is done (waited for at most
        PREFETCH_WAIT_S), if nothing happened since that it could have missed: an urgent job or
        an operator's change signals the worker, and then the boundary reads afresh. (A job of
        another tier queued during those last steps waits for the next boundary, as if it had
        come a little later.)"""
        prefetch, self.prefetch = self.prefetch, None
        if prefetch is None:
            return None
        try:
            # Still in flight: what is left of it is shorter than a fresh read, which would also
            # contend with it for the CPU and the database (bench/switch_cost.py's probe saw a
            # fresh read at 3 of 5 switches, 4.8 ms each, while its prefetch was finishing).
            read = prefetch.result(timeout=PREFETCH_WAIT_S)
        except Exception:  # it failed, or hangs: a fresh read
            return None
        if self.runtime.interrupts.pending(self.job_id):
            return None
        if read.row is None or read.row["state"] != JobState.RUNNING or read.row["dispatch_token"] != self.token:
            return None  # the job is not ours any more: a decision that grave is made on a fresh read
        return read

    def _broker_view(self) -> BrokerView:
        """Jobs waiting per tier and the GPUs just freed, from the broker: the cheap first look.
        When someone waits, the database confirms it."""
        try:
            return queues.boundary_view(count_lanes=settings.CLOCKQ_RT_LANE)
        except RedisError as exc:
            # With the broker down nothing can be dispatched anyway: keep the GPU busy.
            log.warning("job %s: cannot read queue lengths (%s); continuing", self.job_id, exc)
            return BrokerView()
