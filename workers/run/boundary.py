"""A slice's boundary: what the policy decides from, read cheaply, and its decision.

It decides from the job's row, the broker's queue lengths and, only when those say someone
waits, the order in the database (clockq/jobs/order.py): whether a waiting job comes first and
this job is the one to make way for it. That read is made during the slice's last step, on the
runtime's reader thread, when the end could be foreseen, so the GPU does not wait for it; a
change signalled after it (an urgent job, an operator's hold) still counts.

An urgent job (a tier that interrupts: RT, HP) is announced to every busy GPU. One whose job it
could displace looks at its next step (`interrupted`): the same read and the same question, so
the policy's victim leaves (for RT the cheapest switch), and every other GPU goes on within the
same slice, having written nothing. Where the claim stands in those looks is `looks`, a state
machine with named states and moves (workers/run/looking.py).

The order's answer travels as it is (`order.MakeWay`: the job this one makes way for, and the
policy's decision whole), and so does an RT lane's need for the room (`pause.LaneNeedsRoom`): the
policy's boundary takes either (`slicing.Boundary.making_way`), and words are made of it
(`describe`) only where a person reads them: the decision's reason, which the job's history
records.
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

from clockq.bus import queues
from clockq.bus.queues import BrokerView
from clockq.jobs import hot_sql, order
from clockq.jobs.models import Job
from clockq.policy import ordering
from clockq.policy.lanes import lanes_take_urgent
from clockq.policy.slicing import Boundary, BoundaryAction, MadeWayFor, PendingAction, decide_at_boundary, ewma
from clockq.policy.states import JobState
from workers.run.checkpointer import Checkpointer
from workers.run.claim import ClaimedJob
from workers.run.errors import LostOwnership
from workers.run.looking import UNRESPONSIVE_S, Looking, UrgentLooks
from workers.run.pause import LaneNeedsRoom
from workers.run.state import Decided, RunState
from workers.run.tiers import RunTiers
from workers.runtime import Runtime

log = logging.getLogger("clockq.slices")


@dataclass(frozen=True)
class BoundaryRead:
    waiting: list[int]  # dispatch messages in the broker per tier rank, most urgent first
    row: dict[str, Any] | None  # the job's state, dispatch_token, pending_action and tier_id
    # What the order says (clockq/jobs/order.py), read from the database when the broker says
    # someone waits: the waiting job this one leaves its GPU to now (`mine`, what a hand-over
    # takes: `claim.take_handed_over`) and the policy's decision whole (`decision`), or None.
    way: order.MakeWay | None = None
    # The next checkpoint's persist mark, set ahead when the read foresaw a yield: (name, when).
    marked: tuple[str, float] | None = None
    # This GPU was marked free ahead, with the read that foresaw the yield (clockq/bus/free_gpus.py).
    freed_ahead: bool = False

    @property
    def mine(self) -> order.Waiting | None:
        return self.way.mine if self.way is not None else None

    @property
    def decision(self) -> MadeWayFor | None:
        """The order's decision that this job leaves its GPU now (`making_way.MakeWay`), or None."""
        return self.way.decision if self.way is not None and self.way.mine is not None else None


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

    def __init__(
        self, job: ClaimedJob, runtime: Runtime, *, tiers: RunTiers, checkpoints: Checkpointer, state: RunState
    ):
        self.job = job
        self.job_id = job.id
        self.token = job.dispatch_token
        self.runtime = runtime
        self.tiers = tiers
        self.checkpoints = checkpoints
        self.state = state  # read here (its service, its claim's time); JobRun writes it
        self.prefetch: Future[BoundaryRead] | None = None  # the boundary's read, made during the last step
        self.slice_ms = 0.0  # the service this slice adds, as the order judges it
        self.planned_s = math.inf  # the planned slice; none yet during the restore
        self.looks = UrgentLooks()  # where the claim stands in its looks for urgent jobs
        self._named: BoundaryRead | None = None  # MAKING_WAY: the read of the look that named this job
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
            self.prefetch = self.runtime.threads.boundary_reader.submit(self._prefetch_boundary)

    def interrupted(self, serving_ms: float) -> bool:
        """At a step (or during a restore): whether an urgent job takes this GPU now. Almost
        free unless one was announced that could displace this job (`ordering.may_interrupt`);
        then this is the boundary's own read and question (`_look`), `serving_ms` being the
        slice's service so far. True only if the order names a waiting job to make way for now;
        the boundary then decides from that read. Otherwise the slice goes on as it was."""
        rank = self.runtime.threads.interrupts.take_urgent()
        if self.in_lane:
            return False
        relook = False
        if rank is None:
            if not self.looks.relook_due(time.monotonic()):
                return False
            self.looks, relook = self.looks.relooking(), True
        elif not ordering.may_interrupt(rank, self._standing(serving_ms)):
            return False
        return self._look(serving_ms, relook=relook)

    def urgent_takes_gpu(self) -> bool:
        """During a cold restore, which can wait seconds for another worker's persist of a big
        state, or a program's start: whether an urgent job takes this GPU now, instead of after
        the restore and one step. The same look as at a step (`interrupted`)."""
        return self.interrupted(serving_ms=0.0)

    def made_way_during_restore(self) -> MadeWayFor | None:
        """The restore gave the GPU up, because a look named this job (MAKING_WAY): the order's
        decision it made way for, if the look said."""
        read, self._named = self._named, None
        self.looks = self.looks.made_way()
        return read.decision if read is not None else None

    def decide(
        self, done: bool, cut_short: bool, used_ms: float, *, lane_leave: LaneNeedsRoom | None = None
    ) -> Decided:
        """The policy's decision at this boundary, after a slice that ran `used_ms`, and what it
        changed. `lane_leave`: the slice ended at a step because an RT job in this GPU's lane
        needs the room (workers/run/pause.py): the job makes way for it through the checkpoint
        path. LostOwnership if the job is no longer ours."""
        self.slice_ms = used_ms
        read, self._named = self._named, None  # MAKING_WAY: decided from the look that named this job
        self.looks = self.looks.made_way()
        if read is None and not (done or cut_short):
            read = self._prefetched()
        if read is None:
            read = self._read_boundary(done, cut_short)
        row = read.row
        if row is None or row["state"] != JobState.RUNNING or row["dispatch_token"] != self.token:
            raise LostOwnership(f"job is now {row['state'] if row else 'deleted'}")
        self.runtime.threads.interrupts.clear(self.job_id)
        if row["tier_id"] != self.tiers.current.id:  # moved by an operator while running
            self.tiers.current = self.runtime.stores.tiers.get(row["tier_id"])
        self.tiers.serve(used_ms, order.ladder())  # a promoted job served enough goes home
        boundary = Boundary(
            done=done,
            making_way=read.decision or lane_leave,
            pending_action=PendingAction(row["pending_action"]),
            past_deadline=bool(self.job.deadline and timezone.now() >= self.job.deadline),
            shutting_down=self.runtime.shutting_down(),
            cut_short=cut_short,
            checkpoints_failing=not done and self.runtime.stores.checkpoints_failing(self.checkpoints.nbytes),
        )
        decision = decide_at_boundary(boundary)
        for_the_order = boundary.pending_action == PendingAction.NONE and not boundary.shutting_down
        made_way_to = read.mine if decision.action == BoundaryAction.YIELD and for_the_order else None
        if decision.action != BoundaryAction.CONTINUE and not read.freed_ahead:
            self.runtime.leave_gpu()  # before the write that frees it: see clockq/bus/free_gpus.py
        return Decided(decision, made_way_to=made_way_to, marked=read.marked)

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

        - AWAITING_FREE_GPU: the look went on while a GPU counted as free, once that GPU no
          longer counts;
        - AWAITING_VICTIM: the look named another GPU's job to make way, UNRESPONSIVE_S later:
          if the urgent job still waits and that job is still named, its worker died or hangs in
          a long step (a dead worker's job stays running until the reaper takes it back, 20 s
          later), and it is passed over, so that the next victim makes way.

        workers/run/looking.py says each state and move."""
        view = self._broker_view()
        if not any(n for rank, n in enumerate(view.waiting) if ordering.interrupts(rank)):
            self.looks = self.looks.nothing_waits()
            return False
        if lanes_take_urgent(view.waiting, view.idle_lanes):
            return False  # idle RT lanes take them, pausing jobs in place (workers/rt_lane.py)
        try:
            way = self._make_way(view, serving_ms)
            if way.mine is None and way.victim_id is not None and self.looks.overdue(way.victim_id, time.monotonic()):
                self.looks = self.looks.pass_over(way.victim_id)
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
            now = time.monotonic()
            self.looks = self.looks.other_named(
                way.victim_id, me=self.job_id, now=now, gpu_freed=bool(view.freed), relook=relook
            )
            return False
        self.looks = self.looks.this_named()
        assert self.looks.state == Looking.MAKING_WAY
        self._named = BoundaryRead(view.waiting, row, way=way)
        return True

    def _make_way(self, view: BrokerView, serving_ms: float) -> order.MakeWay:
        return order.make_way(
            self.job_id,
            freed=view.freed,
            serving_ms=serving_ms,
            held_s=self._held_s(),
            slice_s=self.planned_s,
            passed_over=self.looks.passed_over,
        )

    def _standing(self, serving_ms: float) -> ordering.Standing:
        """This job as the order sees it now, its service in this slice so far included."""
        served = self.state.run_ms - self.tiers.level_from_ms + serving_ms  # since a batch chance, else all
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
        return self.state.held_s()

    def _row(self) -> dict[str, Any] | None:
        return hot_sql.select_one(Job, self.job_id, ("state", "dispatch_token", "pending_action", "tier_id"))

    def _read_boundary(self, done: bool, cut_short: bool) -> BoundaryRead:
        """What a boundary decides from: the broker's queue lengths, the job's row, and, when
        the broker says someone waits, the order in the database (the broker may hold stale or
        duplicate messages, and knows nothing of service levels or shares). A slice cut short
        has not had its planned time: it leaves only when `ordering.leaves_at` says so."""
        view = BrokerView() if done else self._broker_view()
        row = self._row()
        way = None
        if any(view.waiting) and not self.in_lane:
            way = order.make_way(
                self.job_id,
                freed=view.freed,
                serving_ms=self.slice_ms,
                held_s=self._held_s() if cut_short else None,
                slice_s=self.planned_s,
            )
        return BoundaryRead(view.waiting, row, way=way)

    def _prefetch_boundary(self) -> BoundaryRead:
        """`_read_boundary` for a slice that ends on time, on the runtime's reader thread. When the
        read says the job will likely yield, the next checkpoint's persist mark and this GPU's
        free mark are set here too, more round trips off the GPU's path (a persist mark for a
        checkpoint never named is ignored, and expires; a free mark counts only once the job has
        left the GPU)."""
        try:
            began = time.perf_counter()
            read = self._read_boundary(done=False, cut_short=False)
            self.runtime.threads.boundary_read_s = ewma(
                self.runtime.threads.boundary_read_s, time.perf_counter() - began
            )
            if read.mine is not None:
                name = self.checkpoints.next_name()
                if self.runtime.stores.persister.mark(self.job_id, name):
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
        if self.runtime.threads.interrupts.pending(self.job_id):
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
