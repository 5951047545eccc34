"""Run a job in time slices: claim, restore, step until the slice is used up, then decide.

At each slice boundary the job finishes, continues (nothing to make way for), or checkpoints
and goes back to the tail of its tier's queue. Every database write is a compare-and-set on
(state, dispatch token), so a stale or duplicate message can never run a job twice.

This module is the sequence; each step is a part in workers/run/ that does one thing. What the
claim knows as it runs is its run state (workers/run/state.py), which JobRun alone writes: a part
is given what it reads, and returns what changed (the slice's record, the boundary's `Decided`).
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from typing import Any

from django.conf import settings
from django.utils import timezone

from clockq.bus import signals
from clockq.jobs.checkpoints import RestoreAbandoned, StorageError
from clockq.jobs.quotas import QuotaExceeded
from clockq.jobs.results import ResultError
from clockq.policy.slicing import BoundaryAction, SliceOutcome, ewma
from clockq.policy.states import JobState
from workers.rt_lane import Lane
from workers.run import summary
from workers.run.boundary import SliceBoundary
from workers.run.checkpointer import Checkpointer
from workers.run.claim import ClaimedJob, claim_job, give_back, take_handed_over, take_warm_next
from workers.run.errors import LostOwnership, SliceFailed, workload_errors
from workers.run.failures import SliceFailures, StorageFollowsJob
from workers.run.metrics_recorder import MetricsRecorder
from workers.run.outcome import RunOutcome
from workers.run.pause import PauseWatch, wait_while_lent
from workers.run.restore import Restore, close_workload
from workers.run.result_writer import ResultWriter, succeeded_fields
from workers.run.slice_writes import SliceWrites
from workers.run.state import RunState
from workers.run.steps import SliceRecord, StepLoop
from workers.run.tiers import RunTiers
from workers.runtime import Runtime
from workers.workloads.base import JobRefused, StartAbandoned, Workload

log = logging.getLogger("clockq.slices")

LISTEN_TIMEOUT_S = 2.0  # how long a fresh worker waits for its signal subscription before a claim


# Where a job goes when it leaves the GPU without finishing, and what the run reports.
_LEAVE_GPU: dict[BoundaryAction, tuple[JobState, RunOutcome]] = {
    BoundaryAction.YIELD: (JobState.QUEUED, RunOutcome.YIELDED),
    BoundaryAction.HOLD: (JobState.HELD, RunOutcome.HELD),
    BoundaryAction.TIME_OUT: (JobState.TIMED_OUT, RunOutcome.TIMED_OUT),
}


def run_dispatch(job_id: int, token: str, runtime: Runtime) -> RunOutcome:
    """Handle one dispatch message: its claim's run, and those of the jobs handed over to this
    GPU after it (`_hand_over`). The outcome is the first run's."""
    # Listen before claiming, so that no signal sent once the job is running is missed.
    signals.wait_until_listening(LISTEN_TIMEOUT_S)
    if runtime.threads.drain.drained():
        # Drained a moment ago, and the main process still took a message: it goes back to its
        # queue for a GPU that is not drained (workers/drain.py).
        give_back(job_id, token, runtime)
        runtime.threads.drain.ask_main_process()
        return RunOutcome.DRAINED
    lane = Lane.of(runtime)  # this worker is a GPU's standby RT lane (workers/rt_lane.py)
    if lane is None:
        wait_while_lent(runtime)
        job = claim_job(job_id, token, runtime)
    else:
        job = lane.claim(job_id, token)
    if job is None:
        return RunOutcome.STALE
    outcomes: list[RunOutcome] = []
    while job is not None:  # the message's claim, then the jobs handed over after it
        run = JobRun(job, runtime)
        with lane.turn(job) if lane is not None else nullcontext():
            outcome = run.run()
        outcomes.append(outcome)
        summary.log_run(job.id, outcome)
        if runtime.shutting_down():
            # A stopping worker writes what it snapshotted before it exits.
            runtime.stores.persister.flush()
        if outcome == RunOutcome.STORAGE_FAULT:
            runtime.stores.back_off()
        # A GPU's RT lane takes only the RT jobs its messages wake it for (workers/rt_lane.py).
        job = _hand_over(run, outcome, runtime) if lane is None else None
    return outcomes[0]


def _hand_over(run: JobRun, outcome: RunOutcome, runtime: Runtime) -> ClaimedJob | None:
    """The next job this GPU takes without the broker, or None: after a yield to a waiting job
    of the yielding job's own tier, that job (`claim.take_handed_over`); after a run that ended
    well, the order's next job if this worker holds it warm (`claim.take_warm_next`). Not while
    the GPU's lane has it for an RT job (`wait_while_lent`, as before a claim from a message)."""
    if outcome not in _FREES_GPU or runtime.shutting_down() or runtime.threads.drain.drained():
        return None
    wait_while_lent(runtime, left_for_lane=run.state.left_for_lane)
    to = run.state.made_way_to
    if outcome == RunOutcome.YIELDED and to is not None and to.standing.rank == run.tiers.current.rank:
        # `to` is the order's choice for this GPU, freed (`making_way.victim_for` picks it as
        # `pick_next` would for a free GPU), read at this boundary a moment ago: the claim's CAS
        # guards the rest, so the order is not read again (3.7 of a 7.5 ms switch, measured by
        # bench/switch_cost.py's probe).
        return take_handed_over(to, runtime, best=to)
    return take_warm_next(runtime)


# The runs after which this GPU may take its next job without the broker.
_FREES_GPU = frozenset({RunOutcome.SUCCEEDED, RunOutcome.YIELDED, RunOutcome.HELD, RunOutcome.TIMED_OUT})


class JobRun:
    """One claim of one job on one worker: from restore to finish, yield or failure."""

    def __init__(self, job: ClaimedJob, runtime: Runtime):
        self.job = job
        self.job_id = job.id
        self.runtime = runtime
        self.token = job.dispatch_token
        self.state = RunState.of(job)  # this claim's own: written here only
        self.tiers = RunTiers.of(job, runtime.stores.tiers)
        self.checkpoints = Checkpointer(job, runtime.stores)
        self.boundary = SliceBoundary(job, runtime, tiers=self.tiers, checkpoints=self.checkpoints, state=self.state)
        self.metrics = MetricsRecorder(job.id)
        self.steps = StepLoop(
            job,
            runtime.threads,
            tiers=self.tiers,
            boundary=self.boundary,
            metrics=self.metrics,
            pauses=PauseWatch(runtime, job.id),
        )
        self.results = ResultWriter(job.id, runtime.stores)
        self.writes = SliceWrites(
            job,
            runtime.identity,
            counter_writer=runtime.threads.boundary_reader,
            tiers=self.tiers,
            checkpoints=self.checkpoints,
            state=self.state,
            metrics=self.metrics,
        )
        self.restore = Restore(
            job,
            runtime.identity,
            runtime.stores,
            checkpoints=self.checkpoints,
            metrics=self.metrics,
            urgent_takes_gpu=self.boundary.urgent_takes_gpu,
            note=self.writes.note,
        )
        self.failures = SliceFailures(
            job.id, runtime.stores, checkpoints=self.checkpoints, writes=self.writes, roll_back=self._roll_back
        )

    def run(self) -> RunOutcome:
        """Restore the workload, then slice after slice: step it, and decide at the boundary."""
        self.runtime.threads.leases.hold(self.job_id, self.token)
        record = self.steps.plan(self.state.util_ewma)
        if self.job.storage_faults >= settings.CLOCKQ_JOB_STORAGE_FAULTS:
            # Counted in the background (a persist after it left a GPU): it fails here, unrun.
            return self.failures.fail_at_once(StorageFollowsJob(self.job.storage_faults), record)
        workload = None
        keep_warm = False
        try:
            t0 = time.perf_counter()
            try:
                workload = self.restore.workload()
            except RestoreAbandoned as exc:
                record.restore_ms = (time.perf_counter() - t0) * 1000
                return self._make_way_during_restore(record, str(exc))
            try:
                with workload_errors():
                    workload.ready(abandon=self.boundary.urgent_takes_gpu)  # a switch's cost (a program's start)
            except StartAbandoned as exc:
                record.restore_ms = (time.perf_counter() - t0) * 1000
                return self._make_way_during_restore(record, str(exc))
            record.restore_ms = (time.perf_counter() - t0) * 1000
            self.state.restore_ms = record.restore_ms if self.job.checkpoint_files else 0.0
            self.checkpoints.reserve_memory()
            self.runtime.threads.probe_load(workload)
            self.runtime.note_switch_in(time.perf_counter(), record.restore_ms)
            while True:
                done = self.state.finish_pending or self._run_slice(workload, record)
                outcome = self._at_boundary(workload, record, done)
                if outcome is not None:
                    # Not kept warm where it left to give an RT job its memory: the warm copy would keep it.
                    keep_warm = outcome == RunOutcome.YIELDED and not self.state.left_for_lane
                    return outcome
                record = self.steps.plan(self.state.util_ewma)
        except LostOwnership as exc:
            log.info("job %s: stopping, %s", self.job_id, exc)
            return RunOutcome.LOST_OWNERSHIP
        except SliceFailed as exc:
            return self.failures.after_failure(exc.__cause__ or exc, record)
        except StorageError as exc:
            return self.failures.after_storage_fault(exc, record)
        except (QuotaExceeded, JobRefused, ResultError) as exc:
            return self.failures.fail_at_once(exc, record)
        finally:
            self.checkpoints.discard_snapshot()  # taken but never named: the run ended before its update
            self.runtime.threads.leases.release()
            self.runtime.threads.probe_load(None)
            self.runtime.threads.interrupts.clear(self.job_id)
            if workload is not None:
                if keep_warm and self.checkpoints.files:
                    curves = self.metrics.curves
                    self.runtime.stores.warm.put(
                        self.job_id, self.checkpoints.files[0], workload, self.checkpoints.nbytes, curves
                    )
                else:
                    self.runtime.stores.warm.drop(self.job_id)
                    close_workload(workload, self.job_id)

    def _run_slice(self, workload: Workload, record: SliceRecord) -> bool:
        """The slice's steps (whether the job is done), and what they did folded into the run
        state, a failed slice's too: its failure's writes read it."""
        try:
            return self.steps.run_slice(workload, record)
        finally:
            if record.progress is not None:
                self.state.progress = record.progress
            if record.gpu_util is not None:
                self.state.util_ewma = ewma(self.state.util_ewma, record.gpu_util)
            if record.lane_leave is not None:
                self.state.left_for_lane = True  # its GPU memory is the RT job's

    def _make_way_during_restore(self, record: SliceRecord, when: str) -> RunOutcome:
        """Give the GPU to an urgent job before the restore is done. The job goes back to its
        queue as it was: nothing ran, so there is nothing to checkpoint, and the checkpoint it was
        restoring from is still the one the database names (the next claim waits for it, or
        takes it warm from the worker that wrote it)."""
        made_way_for = self.boundary.made_way_during_restore()
        urgent = made_way_for.describe() if made_way_for is not None else "an urgent job"
        record.cut_short = record.preempted = True
        self.runtime.leave_gpu()
        self.writes.end(
            record,
            SliceOutcome.YIELDED,
            JobState.QUEUED,
            f"made way for {urgent} during its restore ({when})",
            {},
        )
        return RunOutcome.YIELDED

    def _at_boundary(self, workload: Workload, record: SliceRecord, done: bool) -> RunOutcome | None:
        """Finish, continue (None) or leave the GPU, as the policy decides."""
        decided = self.boundary.decide(done, record.cut_short, record.used_ms, lane_leave=record.lane_leave)
        self.state.run_ms += record.used_ms
        self.state.made_way_to = decided.made_way_to
        decision, action = decided.decision, decided.decision.action
        if action == BoundaryAction.FINISH:
            try:
                result = self.results.store(workload)  # durably, before the job counts as succeeded
            except StorageError as exc:
                if self.runtime.shutting_down():
                    raise  # a stopping worker cannot wait: back to the queue, uncharged
                self._wait_for_room_to_finish(workload, record, exc, decided.marked)
                return None
            self.state.finish_pending = False
            self.writes.end(
                record,
                SliceOutcome.COMPLETED,
                JobState.SUCCEEDED,
                decision.reason,
                succeeded_fields(result, timezone.now()),
            )
            return RunOutcome.SUCCEEDED
        if action == BoundaryAction.CONTINUE:
            self._continue(workload, record, decided.marked)
            return None
        target, outcome = _LEAVE_GPU[action]
        parked = target == JobState.QUEUED  # its workload waits in the warm cache
        record.checkpoint_bytes, record.checkpoint_ms = self.checkpoints.take(
            workload, park=parked, marked_ahead=decided.marked
        )
        record.checkpoint_generation = self.checkpoints.generation
        # This job's switch cost, so the planner keeps its switching within the overhead budget:
        # its own checkpoint and restore, plus this worker's measured requeue-hop-claim overhead.
        # Until that is measured it is left out, not guessed: a worker's first claims pay its
        # warm-up (connections, imports), so a guess from them would be too high, and would
        # stretch this job's slices for many switches after the warm-up is over.
        cost = record.checkpoint_ms + self.state.restore_ms + (self.runtime.switch_overhead_ms or 0.0)
        extra: dict[str, Any] = {"switch_cost_ms": ewma(self.job.switch_cost_ms, cost)}
        if target == JobState.TIMED_OUT:
            extra["finished_at"] = timezone.now()
        if parked:
            extra["worker"] = self.runtime.identity.hostname  # where it is warm (claim._leave_to_warm_worker)
        record.preempted = record.cut_short and action == BoundaryAction.YIELD
        self.writes.end(record, SliceOutcome.YIELDED, target, decision.reason, extra)
        if target == JobState.QUEUED:
            self.runtime.switch_out(record.compute_end, record.checkpoint_ms)  # before the persist is queued
        self.checkpoints.persist()
        return outcome

    def _wait_for_room_to_finish(
        self, workload: Workload, record: SliceRecord, exc: StorageError, marked: tuple[str, float] | None
    ) -> None:
        """The job is done but its result cannot be stored (the checkpoint storage fails): it
        keeps its GPU, and its work, and tries again a moment later, holding its lease, rather
        than go back to its queue and do the work since its last checkpoint again."""
        self.results.wait_for_room(exc)
        self._continue(workload, record, marked)  # renews the lease, records the wait as a slice
        self.state.finish_pending = True

    def _continue(self, workload: Workload, record: SliceRecord, marked: tuple[str, float] | None) -> None:
        """Another slice on this GPU, with a periodic checkpoint when one is due (`marked`: its
        persist mark, if the boundary's read set it ahead)."""
        checkpointed = self.checkpoints.due()
        if checkpointed:
            record.checkpoint_bytes, record.checkpoint_ms = self.checkpoints.take(workload, marked_ahead=marked)
            record.checkpoint_generation = self.checkpoints.generation
        self.writes.continued(record, checkpointed=checkpointed)
        if checkpointed:
            self.checkpoints.persist()
            self.checkpoints.keep(self.state.progress)

    def _roll_back(self) -> None:
        """Forget the slice's own work: back to the last checkpoint the database knows. A
        promoted job goes back to its own tier: its promotion was a chance, and it failed."""
        self.tiers.return_home()
        self.metrics.forget()  # its metric points go with its work
        # Back to the files the database names; the generation number stays, never reused.
        self.state.progress = self.checkpoints.roll_back()
