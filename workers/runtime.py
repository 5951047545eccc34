"""What a GPU worker process keeps between tasks, built once per process (`for_worker`), in
three parts that a part of a run takes as it needs them:

- its identity (`WorkerIdentity`): its name, its GPU, whether it is an RT lane;
- its stores (`WorkerStores`): checkpoints and results, the tier rows, the snapshot memory and
  its persister, the warm cache, and whether the storage works;
- its threads (`WorkerThreads`): the GPU probe and sampler, the telemetry publisher, the lease
  keeper, the signal flags, the drain flag and the boundary's reader thread.

`Runtime` holds the three, and what this worker measures of its own switches.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property

from django.conf import settings
from django.db import close_old_connections
from django.db.models import F
from redis import RedisError

from clockq.bus import free_gpus, heartbeat, signals
from clockq.bus.client import client
from clockq.bus.gpu_samples import Publisher
from clockq.jobs.checkpoints import CheckpointStore, StorageError, generation_of
from clockq.jobs.models import Job, JobEvent, QueueTier
from clockq.jobs.results import ResultStore
from clockq.policy.slicing import switch_cost_ewma
from clockq.policy.tiers import row_problems
from workers import shutdown
from workers.drain import DrainFlag
from workers.lease import LeaseKeeper
from workers.persister import Marks, Persist, Persister, SnapshotMemory
from workers.probes import NvmlProbe, SimulatedProbe, make_probe
from workers.sampler import SliceSampler
from workers.warm_cache import WarmCache
from workers.workloads.base import Workload

log = logging.getLogger("clockq.runtime")

STORAGE_BACKOFF_MIN_S = 1.0
GPU_COUNT_TTL_S = 5.0
STORAGE_BACKOFF_MAX_S = 30.0
STORAGE_PROBE_EVERY_S = 1.0
DEGRADED_TTL_S = 60.0  # a degraded mark outlives the backoff by this much, then expires


@dataclass(frozen=True)
class WorkerIdentity:
    hostname: str  # gpu<N>@<host>
    gpu_index: int
    simulated: bool = True
    memory_total_mib: int | None = None
    lane_of: str | None = None  # a GPU's standby RT lane (workers/rt_lane.py): the main worker's name

    @classmethod
    def from_env(cls, hostname: str) -> WorkerIdentity:
        memory = os.environ.get("CLOCKQ_GPU_MEMORY_MIB")
        return cls(
            hostname=hostname,
            gpu_index=int(os.environ.get("CLOCKQ_GPU_INDEX", "-1")),
            simulated=os.environ.get("CLOCKQ_GPU_SIMULATED", "1") == "1",
            memory_total_mib=int(memory) if memory else None,
            lane_of=os.environ.get(heartbeat.RT_LANE_OF_ENV) or None,
        )


@dataclass(frozen=True)
class TierInfo:
    id: int
    code: str
    rank: int
    queue_name: str
    base_slice_ms: int
    min_slice_ms: int
    wait_target_ms: int | None
    start_timeout_ms: int | None


class TierMismatch(RuntimeError):
    """The tier rows disagree with the one definition of the tiers (clockq/policy/tiers.py)."""


@dataclass
class TierCache:
    """Tier rows change rarely (an admin edit); re-read them at most every few seconds. Their
    tunable settings come from the rows; which tiers exist, in what order, on which queues, is
    the definition's, and rows that disagree with it are refused."""

    ttl_s: float = 5.0
    _rows: dict[int, TierInfo] = field(default_factory=dict)
    _loaded_at: float = -1e9

    def get(self, tier_id: int) -> TierInfo:
        if time.monotonic() - self._loaded_at > self.ttl_s or tier_id not in self._rows:
            rows = list(QueueTier.objects.all())
            if problems := row_problems(t.code for t in rows):
                raise TierMismatch(
                    f"the tier rows disagree with clockq/policy/tiers.py: {'; '.join(problems)} "
                    "(`manage.py check --database default` lists the same)"
                )
            self._rows = {
                t.id: TierInfo(
                    t.id,
                    t.code,
                    t.rank,
                    t.queue_name,
                    t.base_slice_ms,
                    t.min_slice_ms,
                    t.wait_target_ms,
                    t.start_timeout_ms,
                )
                for t in rows
            }
            self._loaded_at = time.monotonic()
        return self._rows[tier_id]


class WorkerStores:
    """A worker's storage: checkpoints and results, the tier rows, the snapshot memory and its
    persister, the warm cache; and, while its checkpoint storage fails, how long it backs off
    and why (its degraded mark in the cluster's view)."""

    def __init__(self, identity: WorkerIdentity):
        self.identity = identity
        self.store = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR)
        self.results = ResultStore(settings.CLOCKQ_CHECKPOINT_DIR)
        self.tiers = TierCache()
        self.snapshots = SnapshotMemory(settings.CLOCKQ_SNAPSHOT_MEMORY_MB * 2**20)
        self.persister = Persister(
            self.store,
            self.snapshots,
            on_failure=self.persist_failed,
            on_written=self.storage_works,
            marks=Marks(client, identity.hostname),
        )
        self.warm = WarmCache(
            settings.CLOCKQ_WARM_CACHE_MB * 2**20, settings.CLOCKQ_WARM_CACHE_JOBS, before_close=self.persister.settle
        )
        # While its checkpoint storage fails: how long to wait before the next job, and why.
        self.storage_backoff_s = 0.0
        self.degraded_reason: str | None = None
        self.storage_probed_at = 0.0

    def storage_failed(self, reason: str) -> None:
        """The checkpoint storage failed under a job (which went back to its queue, uncharged).
        Say so in the cluster's view; `back_off` then waits before the next job."""
        self.storage_backoff_s = min(max(2 * self.storage_backoff_s, STORAGE_BACKOFF_MIN_S), STORAGE_BACKOFF_MAX_S)
        self.degraded_reason = f"checkpoint storage failing: {reason}"
        self._report_degraded()

    def _report_degraded(self) -> None:
        reason = self.degraded_reason or "checkpoint storage failing"
        try:
            heartbeat.report_degraded(client(), self.identity.hostname, reason, self.storage_backoff_s + DEGRADED_TTL_S)
        except RedisError as exc:
            log.warning("could not report %s degraded: %s", self.identity.hostname, exc)

    def checkpoints_failing(self, need_bytes: int) -> bool:
        """Whether a checkpoint of `need_bytes` cannot be written now: the storage failed and has
        not come back. While it fails it is tried (CheckpointStore.probe) at most once every
        STORAGE_PROBE_EVERY_S, so that a slice boundary stays cheap, and the degraded mark is
        kept fresh; once a probe succeeds, jobs switch again."""
        if self.degraded_reason is None:
            return False
        now = time.monotonic()
        if now - self.storage_probed_at < STORAGE_PROBE_EVERY_S:
            return True
        self.storage_probed_at = now
        try:
            self.store.probe(need_bytes)
        except StorageError:
            self._report_degraded()
            return True
        self.storage_works()
        return False

    def count_storage_fault(self, job_id: int) -> int | None:
        """A write of this job's failed: probe the store with a small synced write. If it takes
        that, the store works for others and the fault counts toward the job (how many it has
        met now); if not, the store itself fails, and nothing is counted (None)."""
        try:
            self.store.probe(0)
        except StorageError:
            return None
        Job.objects.filter(pk=job_id).update(storage_faults=F("storage_faults") + 1)
        return Job.objects.filter(pk=job_id).values_list("storage_faults", flat=True).first()

    def persist_failed(self, persist: Persist, exc: StorageError) -> None:
        """A checkpoint the database already names could not be written (in the background, after
        the job left this GPU). The job resumes from the generation before it; its history says
        why, and the name is taken off the job if no one has moved on since, so that the next
        claim does not wait for a file that will never come. The fault is counted toward the job
        if the store takes other writes (its next claim fails it past the limit)."""
        job_id, name = persist.job_id, persist.name
        previous = persist.keep[1] if len(persist.keep) > 1 else None
        try:
            if self.count_storage_fault(job_id) is None:
                self.storage_failed(str(exc))
            Job.objects.filter(pk=job_id, checkpoint_files=list(persist.keep)).update(
                checkpoint_files=list(persist.keep[1:])
            )
            state = Job.objects.filter(pk=job_id).values_list("state", flat=True).first()
            if state is None:
                return
            then = f"resumes from generation {generation_of(previous)}" if previous else "starts again"
            JobEvent.objects.create(
                job_id=job_id,
                from_state=state,
                to_state=state,
                reason=f"checkpoint generation {generation_of(name)} was lost: writing it failed ({exc}); "
                f"the job {then}"[:2000],
                actor=self.identity.hostname,
            )
        finally:
            close_old_connections()  # this runs in the persist thread, which keeps no connection

    def back_off(self) -> None:
        """Wait before taking the next job, longer after each storage failure, so a worker with a
        broken disk does not churn through the queue. A stop request ends the wait early."""
        log.warning("%s; waiting %.0f s before the next job", self.degraded_reason, self.storage_backoff_s)
        shutdown.requested.wait(self.storage_backoff_s)

    def storage_works(self) -> None:
        """A checkpoint was written: the storage is back, if it was ever gone."""
        if self.degraded_reason is None:
            return
        self.storage_backoff_s, self.degraded_reason = 0.0, None
        try:
            heartbeat.clear_degraded(client(), self.identity.hostname)
        except RedisError as exc:
            log.warning("could not clear the degraded mark of %s: %s", self.identity.hostname, exc)
        log.info("%s: checkpoint storage works again", self.identity.hostname)


class WorkerThreads:
    """The threads a worker runs beside its jobs, each started on first use: the GPU probe and
    the per-slice sampler, the telemetry publisher, the lease keeper, the signal listener's
    flags, the drain flag, and the boundary's reader thread (with how long its read takes)."""

    def __init__(self, identity: WorkerIdentity):
        self.identity = identity
        # How long the boundary's read takes on the reader thread (s, a moving average): the read
        # starts at least twice that before the slice's end, so it is done when the GPU gets there.
        self.boundary_read_s = 0.002

    @cached_property
    def probe(self) -> NvmlProbe | SimulatedProbe:
        return make_probe(self.identity.gpu_index, self.identity.simulated, self.identity.memory_total_mib)

    @cached_property
    def sampler(self) -> SliceSampler:
        return SliceSampler(self.probe, interval_s=settings.CLOCKQ_SAMPLE_EVERY_S)

    @cached_property
    def publisher(self) -> Publisher:
        return Publisher(client())

    @cached_property
    def leases(self) -> LeaseKeeper:
        return LeaseKeeper()

    @cached_property
    def interrupts(self) -> signals.Interrupts:
        return signals.interrupts()

    @cached_property
    def drain(self) -> DrainFlag:
        return DrainFlag(self.identity.hostname, self.interrupts)

    @cached_property
    def boundary_reader(self) -> ThreadPoolExecutor:
        """One thread that reads what a slice boundary decides from while the slice's last step
        runs (workers/run/boundary.py), with its own database connection. It also writes the
        slice counters once a boundary commits (clockq/bus/counters.py), so the switch does not
        wait for that round trip either."""
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="clockq-boundary")

    def probe_load(self, workload: Workload | None) -> None:
        """Tell a simulated GPU what the running workload declares (real GPUs measure it)."""
        if isinstance(self.probe, SimulatedProbe):
            self.probe.set_load(workload.declared_gpu_util() if workload is not None else None)


class Runtime:
    """A GPU worker process's identity, stores and threads, and what it measures of its own
    switches (the part of a switch that is not the jobs' own checkpoint and restore)."""

    def __init__(self, identity: WorkerIdentity):
        self.identity = identity
        self.stores = WorkerStores(identity)
        self.threads = WorkerThreads(identity)
        # The part of a switch on this worker that is not the jobs' own checkpoint and restore:
        # requeue, message hop, claim. Measured as GPU idle time between two jobs' steps.
        self.switch_overhead_ms: float | None = None
        self.last_yield: tuple[float, float] | None = None  # (compute end, its checkpoint ms)
        self._gpus_counted: tuple[float, int] = (-1e9, 1)  # (when, live GPU workers)

    @property
    def persister(self) -> Persister:
        """The stores' persister (what a stopping worker, or a test's teardown, flushes)."""
        return self.stores.persister

    def gpu_count(self) -> int:
        """Live GPU workers in the cluster, this one included (the heartbeats, re-read at most
        every GPU_COUNT_TTL_S): the size of the pool that the lower tiers' share is a part of,
        as a claim judges it. (A boundary counts the GPUs it could wait for otherwise: a dead
        worker's heartbeat outlives it; clockq/bus/free_gpus.py.)"""
        at, count = self._gpus_counted
        if time.monotonic() - at > GPU_COUNT_TTL_S:
            try:
                count = sum(w.get("gpu") is not None for w in heartbeat.live_workers())
            except RedisError as exc:
                log.warning("cannot count the live GPU workers (%s); keeping %d", exc, count)
            self._gpus_counted = (time.monotonic(), max(count, 1))
        return self._gpus_counted[1]

    def leave_gpu(self) -> bool:
        """This worker's job is about to leave its GPU: mark the GPU free (clockq/bus/free_gpus.py)
        before the write that frees it, so that no other GPU's boundary in between takes it for
        gone and makes way for a job this one is about to claim. Whether the mark was set. An RT
        lane marks nothing: it is no GPU another job could take."""
        if self.identity.lane_of is not None:
            return False
        try:
            free_gpus.mark_free(client(), self.identity.hostname)
            return True
        except RedisError as exc:
            log.warning("could not mark %s free: %s", self.identity.hostname, exc)
            return False

    def switch_out(self, compute_end: float, checkpoint_ms: float) -> None:
        """A job yielded its GPU to the queue: a switch is under way until the next job's first
        step (`note_switch_in`). Its checkpoint is written after that (Persister.pause)."""
        self.last_yield = (compute_end, checkpoint_ms)
        self.stores.persister.pause()

    def note_switch_in(self, first_step_at: float, restore_ms: float) -> None:
        """Called as a job's first step starts: if the previous task yielded, the GPU has been
        idle since that job's last step, and the part not spent on checkpoint and restore is
        this worker's switch overhead."""
        self.stores.persister.resume()  # the switch is over: the yielded job's checkpoint may be written
        if self.last_yield is None:
            return
        compute_end, checkpoint_ms = self.last_yield
        self.last_yield = None
        gap_ms = (first_step_at - compute_end) * 1000
        if gap_ms < 2000:  # longer means the GPU sat idle, not switching
            overhead = max(gap_ms - checkpoint_ms - restore_ms, 0.0)
            self.switch_overhead_ms = switch_cost_ewma(self.switch_overhead_ms, overhead)

    @staticmethod
    def shutting_down() -> bool:
        return shutdown.requested.is_set()


_runtime: Runtime | None = None
_lock = threading.Lock()


def for_worker(hostname: str) -> Runtime:
    """This process's runtime, built on first use (in the pool child, after the fork)."""
    global _runtime
    with _lock:
        if _runtime is None or _runtime.identity.hostname != hostname:
            _runtime = Runtime(WorkerIdentity.from_env(hostname))
        return _runtime


def current() -> Runtime | None:
    """This process's runtime if it has one (not built just to ask)."""
    return _runtime
