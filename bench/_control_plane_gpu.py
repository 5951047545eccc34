"""One simulated GPU of bench/control_plane.py's fleet: a GPU worker's control-plane work,
through clockq's own code, with the GPU and Celery's machinery stood in.

A GPU goes round: fetch a message, claim (`claim_job`), run a slice (a timer: no steps), then
at the boundary read what the policy decides from (`SliceBoundary.decide`) and either continue
(`SliceWrites.continued`) or yield to its queue (`SliceWrites.end`, whose transition pushes the
requeue's message after the commit), then fetch again. Beside that, every few seconds, its
heartbeat (`heartbeat.announce`, and the idle telemetry), its lease (`workers.lease.renew`, as
the LeaseKeeper thread does) and Celery's heartbeat event.
"""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING

from django.conf import settings

from clockq.bus import gpu_samples, heartbeat, queues
from clockq.bus.client import client
from clockq.bus.gpu_samples import Publisher
from clockq.policy.slicing import BoundaryAction, SliceOutcome
from clockq.policy.states import JobState
from workers.lease import renew
from workers.run.claim import ClaimedJob, claim_job
from workers.run.errors import LostOwnership
from workers.run.steps import SliceRecord
from workers.runtime import Runtime, WorkerIdentity
from workers.slice_runner import JobRun

if TYPE_CHECKING:
    from _control_plane_fleet import Fleet

CELERY_HEARTBEAT_S = 2.0  # a Celery worker's own heartbeat event
MAX_POPS_PER_FETCH = 20  # stale messages dropped in one go before the GPU gives the thread back
SWITCH_REASON = "control-plane bench: a switch at this boundary"


def light_runtime(hostname: str, gpu_index: int, reader, dilation: float = 1.0) -> Runtime:
    """A GPU worker's runtime as `workers.runtime.for_worker` builds it, but for the boundary
    reader thread (counters after a commit), which is the fleet's shared one. Nothing in it
    starts a thread until used, and the bench uses none of those: no sampler, lease keeper,
    persister or warm cache (no steps, no checkpoints). With a `dilation`, its tier rows and
    its telemetry are refreshed that many times less often."""
    runtime = Runtime(WorkerIdentity(hostname=hostname, gpu_index=gpu_index, simulated=True))
    # functools.cached_property keeps its value in the instance's __dict__
    runtime.threads.__dict__["boundary_reader"] = reader
    if dilation != 1.0:
        runtime.stores.tiers.ttl_s *= dilation
        runtime.threads.__dict__["publisher"] = Publisher(client(), min_interval_s=dilation)
    return runtime


class SimGpu:
    def __init__(self, fleet: Fleet, index: int):
        spec = fleet.spec
        self.fleet = fleet
        host, gpu_index = divmod(index, spec.gpus_per_host)
        self.hostname = f"gpu{gpu_index}@cp-host{host}"
        self.runtime = light_runtime(self.hostname, gpu_index, fleet.reader, spec.dilation)
        self.heartbeat_every_s = heartbeat.INTERVAL_S * spec.dilation
        self.lease_every_s = max(settings.CLOCKQ_LEASE_S / 4, 0.2) * spec.dilation  # the LeaseKeeper's tick
        self.celery_heartbeat_every_s = CELERY_HEARTBEAT_S * spec.dilation
        self.info = {
            "hostname": self.hostname,
            "gpu": gpu_index,
            "pid": 0,
            "host": socket.gethostname(),
            "started": time.time(),
            "service_ladder_s": list(settings.CLOCKQ_SERVICE_LADDER_S),
        }
        self.run: JobRun | None = None
        self.job: ClaimedJob | None = None
        self.tag: str | None = None  # the delivery tag of the message whose task is running
        self.record: SliceRecord | None = None
        self.slice_began = 0.0  # perf_counter
        self.left_at: float | None = None  # when its last job left it (time.time)
        self.due: float | None = None  # when its current slice ends (time.time)

    def schedule(self, start: float) -> None:
        rng, spec = self.fleet.rng, self.fleet.spec
        at = self.fleet.timers.at
        at(start + rng.uniform(0, spec.slice_s), "fetch", self.fetch)
        at(start + rng.uniform(0, self.heartbeat_every_s), "heartbeat", self.heartbeat)
        at(start + rng.uniform(0, self.lease_every_s), "lease", self.renew_lease)
        if spec.celery_traffic:
            at(start + rng.uniform(0, self.celery_heartbeat_every_s), "celery heartbeat", self.celery_heartbeat)

    # --- the job cycle -----------------------------------------------------------------------

    def fetch(self) -> None:
        """Take messages until one claims a job; a stale one is acknowledged and dropped."""
        samples, celery = self.fleet.samples, self.fleet.celery
        for _ in range(MAX_POPS_PER_FETCH):
            began = time.perf_counter()
            try:
                fetched = celery.fetch()
            except Exception:
                self._again("fetch", 0.1)
                raise
            samples.add("fetch", time.time(), (time.perf_counter() - began) * 1000)
            if fetched is None:
                self._again("fetch", 0.0)  # an empty queue: back in line, the thread freed
                return
            raw, tag = fetched
            if self._claim(raw, tag):
                return
            celery.ack(tag)
        self._again("fetch", 0.0)

    def _claim(self, raw: bytes, tag: str) -> bool:
        samples = self.fleet.samples
        parsed = queues.parse_dispatch(raw)
        if parsed is None:
            samples.count("malformed", time.time())
            return False
        began = time.perf_counter()
        try:
            job = claim_job(*parsed, self.runtime)
        except Exception:
            self.fleet.celery.ack(tag)
            self._again("fetch", 0.1)
            raise
        now, ms = time.time(), (time.perf_counter() - began) * 1000
        if job is None:
            samples.add("stale", now, ms)
            return False
        samples.add("claim", now, ms)
        if self.left_at is not None:
            samples.add("idle", now, (now - self.left_at) * 1000)  # the GPU between two jobs
        self.run, self.job, self.tag = JobRun(job, self.runtime), job, tag
        self._start_slice()
        return True

    def _start_slice(self) -> None:
        """A slice that ends one `slice_s` after the GPU's last boundary: each GPU has a boundary
        every `slice_s`, a switch's time included, unless a switch took longer than that."""
        assert self.run is not None
        record = self.run.steps.plan(self.run.state.util_ewma)
        self.run.boundary.new_slice(record.plan.ms)  # as StepLoop.run_slice does
        self.record, self.slice_began = record, time.perf_counter()
        now, slice_s = time.time(), self.fleet.spec.slice_s
        due = self.due + slice_s if self.due is not None else now + slice_s
        if due <= now:
            self.fleet.samples.count("missed beats", now)
            due = now + slice_s
        self.due = due
        self.fleet.timers.at(due, "boundary", self.boundary)

    def boundary(self) -> None:
        run, record, samples = self.run, self.record, self.fleet.samples
        assert run is not None and record is not None and self.job is not None
        ended = time.perf_counter()
        record.compute_end, record.used_ms, record.steps = ended, (ended - self.slice_began) * 1000, 1
        self.runtime.threads.publisher.maybe_publish(self.runtime.threads.probe.sample(include_slow=False))
        try:
            decision = run.boundary.decide(False, False, record.used_ms).decision
        except LostOwnership:
            samples.count("lost ownership", time.time())
            self._leave()
            return
        except Exception:
            self._leave()
            raise
        read_done = time.perf_counter()
        samples.add("read", time.time(), (read_done - ended) * 1000)
        if decision.action not in (BoundaryAction.CONTINUE, BoundaryAction.YIELD):
            raise RuntimeError(f"unexpected boundary decision {decision}")  # no deadlines, holds or ends here
        policy_yields = decision.action == BoundaryAction.YIELD
        if policy_yields:
            samples.count("policy yields", time.time())
        try:
            if policy_yields or self.fleet.rng.random() < self.fleet.spec.switch_share:
                self._yield(record, decision.reason if policy_yields else SWITCH_REASON, policy_yields)
                samples.add("yield", time.time(), (time.perf_counter() - read_done) * 1000)
                samples.add("boundary", time.time(), (time.perf_counter() - ended) * 1000)
                self._leave()
                return
            run.writes.continued(record, checkpointed=False)
        except LostOwnership:
            samples.count("lost ownership", time.time())
            self._leave()
            return
        except Exception:
            self._leave()
            raise
        samples.add("continue", time.time(), (time.perf_counter() - read_done) * 1000)
        samples.add("boundary", time.time(), (time.perf_counter() - ended) * 1000)
        self._start_slice()

    def _yield(self, record: SliceRecord, reason: str, policy_yields: bool) -> None:
        """What `JobRun._at_boundary` does for a yield, without the checkpoint: the GPU marked
        free before the write that frees it (decide() did it if the policy said so), then the
        transition back to the queue with the slice row, whose commit pushes the message."""
        assert self.run is not None
        if not policy_yields:
            self.runtime.leave_gpu()
        self.run.writes.end(record, SliceOutcome.YIELDED, JobState.QUEUED, reason, {})

    def _leave(self) -> None:
        """The task returns: acknowledged, and the GPU fetches the next message at once."""
        if self.job is not None:
            self.runtime.threads.interrupts.clear(self.job.id)
        if self.tag is not None:
            self.fleet.celery.ack(self.tag)
        self.run = self.job = self.tag = self.record = None
        self.left_at = time.time()
        self.fetch()

    def _again(self, kind: str, after_s: float) -> None:
        action = {"fetch": self.fetch}[kind]
        self.fleet.timers.at(time.time() + after_s, kind, action)

    # --- beside the job cycle ----------------------------------------------------------------

    def heartbeat(self) -> None:
        """The GPU worker's heartbeat thread: its key, and the idle telemetry (only if absent)."""
        self.fleet.timers.at(time.time() + self.heartbeat_every_s, "heartbeat", self.heartbeat)
        began = time.perf_counter()
        heartbeat.announce(self.fleet.redis, self.info)
        gpu_samples.publish(self.fleet.redis, self.runtime.threads.probe.sample(), only_if_absent=True)
        self.fleet.samples.add("heartbeat", time.time(), (time.perf_counter() - began) * 1000)

    def renew_lease(self) -> None:
        self.fleet.timers.at(time.time() + self.lease_every_s, "lease", self.renew_lease)
        job = self.job
        if job is not None:
            began = time.perf_counter()
            renew(job.id, job.dispatch_token)
            self.fleet.samples.add("lease", time.time(), (time.perf_counter() - began) * 1000)

    def celery_heartbeat(self) -> None:
        self.fleet.timers.at(time.time() + self.celery_heartbeat_every_s, "celery heartbeat", self.celery_heartbeat)
        self.fleet.celery.heartbeat()
