"""The paused worker's side of its GPU's RT lane: pause in place at a step, and lend the GPU.

The lane (workers/rt_lane.py) asks through one fact, its pause request in Redis
(clockq/bus/lanes.py). Pub/sub only wakes this side: a `lane` signal says that the request may
have changed (`Interrupts.lane_hinted`), and carries nothing else, so what this side does
always rests on a read of the key. While nothing was heard, a step costs a set lookup.

- At a step (`PauseWatch.asked`): after a hint, read the request. One for this job, not yet
  answered, is answered there: pause in place until the RT job ends (`PauseWatch.hold`), or
  leave through the checkpoint path when the RT job does not fit beside this one.
- Before a claim (`wait_while_lent`): while the lane runs an RT job that this GPU's last job
  left for through a checkpoint, the worker starts nothing.

Either ends when the request is gone: the RT job ended, the lane's key expired (a lane killed
with kill -9 stops renewing it) or the main worker's watch dropped it (workers/lane_life.py).
Neither lasts longer than CLOCKQ_PAUSE_MAX_S.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.conf import settings
from redis import RedisError

from clockq.bus import lanes
from clockq.bus.client import client
from clockq.jobs.models import Job
from clockq.policy.lanes import pause_over
from clockq.policy.states import JobState
from workers import lane_life
from workers.runtime import Runtime

log = logging.getLogger("clockq.rt_lane")

PAUSED_POLL_S = 0.05  # how often a paused job reads its request, between the signals it hears


@dataclass(frozen=True)
class LaneNeedsRoom:
    """The RT job in this GPU's lane that the running job leaves its GPU to, through the
    checkpoint path, and why: a decision for the boundary (`slicing.Boundary.making_way`), in
    words only for the job's history (`describe`)."""

    rt_job: int
    lane: str
    why: str

    def describe(self) -> str:
        return f"RT job #{self.rt_job} in this GPU's RT lane {self.lane}, {self.why}"


@dataclass(frozen=True)
class PauseEnd:
    paused_s: float
    leave: LaneNeedsRoom | None = None  # the job leaves through the checkpoint path now, if it does


class PauseWatch:
    """A running job's side of its GPU's lane: at each step, whether the lane asks it to pause
    (`asked`), and the pause itself (`hold`)."""

    def __init__(self, runtime: Runtime, job_id: int):
        self.runtime = runtime
        self.job_id = job_id
        self.me = runtime.identity.hostname
        self.on = settings.CLOCKQ_RT_LANE and runtime.identity.lane_of is None
        self.handled: set[int] = set()  # RT jobs whose request this job has answered

    def asked(self) -> lanes.PauseRequest | None:
        """The lane's request that this job answers now, if any. Called at every step: a set
        lookup, unless the lane's key changed since this worker last read it."""
        if not self.on or not self.runtime.threads.interrupts.take_lane_hint(self.me):
            return None
        try:
            request = lanes.pause_request(client(), self.me)
        except RedisError as exc:  # the lane runs its RT job beside this one, or waits its bound out
            log.warning("job %s: cannot read its pause request (%s); going on", self.job_id, exc)
            return None
        if request is None or request.rt_job in (self.job_id, *self.handled) or not request.applies_to(self.job_id):
            return None
        return request

    def hold(self, request: lanes.PauseRequest) -> PauseEnd:
        """Pause here until the RT job ends, its lane is gone, or the pause is over its bound."""
        self.handled.add(request.rt_job)
        if request.mode == lanes.MODE_CHECKPOINT and request.target == self.job_id:
            return PauseEnd(0.0, leave=_made_way(request, "which does not fit beside it in GPU memory"))
        began = time.monotonic()
        how, leave = "resumed", None
        interrupts = self.runtime.threads.interrupts
        # The hints heard while paused are left for the next step's `asked`: a request that
        # replaces this one is answered there.
        while True:
            try:
                truth = lanes.pause_request(client(), self.me)
            except RedisError as exc:
                log.warning("job %s: cannot read its pause request (%s); resuming", self.job_id, exc)
                how = "resumed: broker unreachable"
                break
            if truth is None or truth.rt_job != request.rt_job:
                lost = lane_life.lane_lost(request.rt_job, since=began)
                gone = truth is None and (lost or not self._ended(request.rt_job))
                how = "resumed: lane gone" if gone else "resumed"
                break
            paused_s = time.monotonic() - began
            if pause_over(paused_s, settings.CLOCKQ_PAUSE_MAX_S):
                how = "checkpoint: pause over its bound"
                leave = _made_way(request, f"after a pause of {paused_s:.1f} s (CLOCKQ_PAUSE_MAX_S)")
                break
            if self.runtime.shutting_down() or interrupts.poked(self.job_id):
                how = "resumed: stop or operator"
                break
            interrupts.lane_changed.wait(PAUSED_POLL_S)
            interrupts.lane_changed.clear()
        paused_s = time.monotonic() - began
        self._record(request, paused_s, how)
        return PauseEnd(paused_s, leave)

    @staticmethod
    def _ended(rt_job: int) -> bool:
        state = Job.objects.filter(pk=rt_job).values_list("state", flat=True).first()
        return state is None or state != JobState.RUNNING

    def _record(self, request: lanes.PauseRequest, paused_s: float, how: str) -> None:
        log.info("job %s paused %.1f ms for RT job %s (%s)", self.job_id, paused_s * 1000, request.rt_job, how)
        try:
            lanes.record_pause(
                client(),
                {
                    "job": self.job_id,
                    "rt_job": request.rt_job,
                    "worker": self.me,
                    "paused_ms": paused_s * 1000,
                    "how": how,
                },
            )
        except RedisError as exc:
            log.warning("job %s: could not record its pause: %s", self.job_id, exc)


def _made_way(request: lanes.PauseRequest, why: str) -> LaneNeedsRoom:
    return LaneNeedsRoom(request.rt_job, request.lane, why)


def wait_while_lent(runtime: Runtime, *, left_for_lane: bool = False) -> None:
    """Before a main worker claims: while its lane runs an RT job that its last job made way
    for through a checkpoint (it does not fit beside another), start nothing; at most
    CLOCKQ_PAUSE_MAX_S, and not after the request is gone (ended, or expired with its lane).
    The request is read when the last run left for the lane (`left_for_lane`) or a signal hinted
    at a change; otherwise none can stand, and the claim costs no read."""
    if not settings.CLOCKQ_RT_LANE or runtime.identity.lane_of is not None:
        return
    me, interrupts = runtime.identity.hostname, runtime.threads.interrupts
    if not left_for_lane and not interrupts.lane_hinted(me):
        return
    try:
        request = lanes.pause_request(client(), me)
    except RedisError:
        return
    if request is None or request.mode != lanes.MODE_CHECKPOINT:
        return  # a pause in place, if it applies, is the next job's to answer (its hint stays)
    deadline = time.monotonic() + settings.CLOCKQ_PAUSE_MAX_S
    while time.monotonic() < deadline and not runtime.shutting_down():
        interrupts.lane_changed.wait(PAUSED_POLL_S)
        interrupts.lane_changed.clear()
        try:
            truth = lanes.pause_request(client(), me)
        except RedisError:
            return
        if truth is None or truth.rt_job != request.rt_job:
            return
    # Still lent past the bound: the next claim waits again, as this one did.
    interrupts.heard_lane(me)
