"""Run an external program, so users can bring existing training scripts. Submitting one needs
the `run command` permission; it runs in a bubblewrap sandbox (workers/sandbox.py): in PID,
mount and user namespaces of its own, as a uid no other running job has, seeing the system
read-only and its work folder as its only writable place, with resource limits and no
credentials to clockq. Every file the worker touches in the work folder is opened there
without following a link (workers/job_folder.py).

The program and clockq talk through a small protocol. Write scripts against it exactly:

Start
    clockq runs ``argv`` (no shell) in its own sandbox, session and PID namespace, as a uid of
    its own (``CLOCKQ_COMMAND_UID_BASE`` + the job's id, as a rule), with the job's work folder
    (its only writable place, at the same path as on the host) as the current directory and
    HOME, a private ``/tmp``, stdin from /dev/null, and stdout and stderr read by the worker
    through pipes: the last ``CLOCKQ_COMMAND_LOG_KEEP_KB`` of each, across restarts, is kept in
    ``stdout.log`` and ``stderr.log`` in that folder, rewritten when the program stops. The
    environment is the worker's, less clockq's credentials (DATABASE_URL, REDIS_URL,
    SECRET_KEY, ...), with ``CUDA_VISIBLE_DEVICES`` left as inherited (the worker's GPU), plus:

    ``CLOCKQ_CHECKPOINT_FILE``
        Absolute path (in the work folder) where the program writes its checkpoint.
    ``CLOCKQ_PROGRESS_FILE``
        Absolute path where the program may write its progress: one float in [0, 1], as text.
        Write it atomically (temporary file, then rename) so clockq never reads half of it.
    ``CLOCKQ_JOB_ID``
        The job's id.
    ``CLOCKQ_WORK_DIR``
        The job's work folder, which survives requeues.
    ``CLOCKQ_METRICS_FILE``
        Where the program may report metrics: it appends one JSON object per line, with an
        integer ``step`` and named numbers, e.g. ``{"step": 120, "loss": 0.31, "accuracy": 0.9}``.
        Write whole lines. A step written again (after a resume from an older checkpoint)
        replaces the points from that step on.
    ``CLOCKQ_RESULT_DIR``
        Where the program puts its result: ``result`` in the work folder (the program creates
        it). When the job succeeds, the regular files directly in it (names of letters, digits,
        ``.``, ``_`` and ``-``; at most 100) become the job's downloadable result. A link or a
        folder there fails the job.
    ``CLOCKQ_RESUME``
        ``1`` when resuming, absent otherwise.

Resume
    When the job resumes from a checkpoint, ``--resume`` is appended as the last argument,
    ``CLOCKQ_RESUME=1`` is set, and ``CLOCKQ_CHECKPOINT_FILE`` holds exactly the bytes the
    program wrote there at its last checkpoint. A fresh start has neither the flag nor a
    checkpoint file: clockq deletes stale checkpoint and progress files first.

Checkpoint
    When clockq needs a checkpoint (the end of a slice where the job yields, or a periodic
    checkpoint) it sends ``SIGUSR1`` to the program's process (not its group: in a shell
    wrapper, ``exec`` the real program). The program then writes a non-empty checkpoint to
    ``CLOCKQ_CHECKPOINT_FILE`` (atomically: temporary file in the same folder, then rename)
    and exits with code 75 (EX_TEMPFAIL, "requeue me"). It has 60 seconds; after that clockq
    kills its sandbox and the checkpoint fails. After a checkpoint the program is
    stopped; if the job keeps running, clockq starts it again with ``--resume``.

    Install the ``SIGUSR1`` handler first thing, before heavy imports. clockq waits up to 2
    seconds after each start for the handler to be in place (it reads the process's caught
    signals from /proc) before it goes on; at a claim, that wait counts as the switch's cost,
    not the slice's. If an urgent job takes the GPU meanwhile, the program is killed (SIGKILL to its
    group) and starts again from the same checkpoint later. A program killed by ``SIGUSR1``
    within its first 10 seconds, before its handler was in place, is treated as not started
    yet: the checkpoint is the one it started from (none on a fresh start) and it starts again
    next time. Killed by ``SIGUSR1`` later, it fails.

Exit
    When the program's first process exits, every process it left is killed (the sandbox's PID
    namespace ends with it). Exit code 0 means done. Exit code 75 is only an answer to ``SIGUSR1``. Any other exit code,
    75 unasked, or death by a signal fails the job, with the exit code and the last 2 KB of
    the program's stderr in the error. As in a shell, an exit code above 128 reads as death by
    signal (code - 128). If a program may finish while a checkpoint is being
    requested, it should write a final checkpoint before exiting 0: clockq then keeps that
    checkpoint, and a program resumed from it should exit 0 at once.

Storage
    Everything in the work folder counts toward the job's storage allowance while the program
    runs, in bytes (apparent size: a sparse file counts as what a copy of it takes) and in
    files: at most ``CLOCKQ_JOB_STORAGE_MB`` and ``CLOCKQ_JOB_FILES`` for the job, and what its
    owner's quota leaves. A program that passes either is killed and the job fails, with a
    reason that names the limit; so does a checkpoint or a result bigger than the job may
    store, which is refused before it is read (workers/storage_watch.py).

``tests/workloads/fixtures/count_script.py`` is a complete example to copy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings

from workers.job_folder import JobFolder
from workers.memory_bound import MemoryLimitExceeded
from workers.program_bounds import ProgramBounds
from workers.program_output import OutputTail
from workers.sandbox import Pidfd, UidLease, first_child, prepare_work_dir, read_child_pid, sandbox_for_commands
from workers.workloads.base import RunContext, StartAbandoned, Workload
from workers.workloads.command_files import (
    CHECKPOINT_NAME,
    METRICS_NAME,
    PROGRESS_NAME,
    RESULT_DIR_NAME,
    STDERR_NAME,
    STDOUT_NAME,
    copy_result,
    kept_log,
    read_checkpoint,
    read_metrics,
    read_progress,
)
from workers.workloads.command_storage import ProgramStorage, StorageLimitExceeded
from workers.workloads.program_start import (
    cannot_start,
    catches_signal,
    exec_failure,
    program_environment,
    program_problem,
    start_error,
)

log = logging.getLogger(__name__)

EX_TEMPFAIL = 75
CHECKPOINT_TIMEOUT_S = 60.0
STARTUP_GRACE_S = 10.0
HANDLER_WAIT_S = 2.0  # ample for an interpreter's start; a program that installs none goes on
HANDLER_POLL_S = 0.002
STDERR_TAIL_BYTES = 2048
MAX_RUNNING_PROGRESS = 0.999


class CommandWorkload(Workload):
    name = "command"

    def setup(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.sandbox = sandbox_for_commands()  # JobRefused if this worker cannot run programs safely
        self.work_dir = Path(ctx.work_dir).resolve()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        uid = self.sandbox.uid_for(ctx.job_id)
        prepare_work_dir(self.work_dir, Path(settings.CLOCKQ_CHECKPOINT_DIR), uid)
        self.folder = JobFolder(self.work_dir, uid)
        if uid is not None and self.folder.owned_by() != uid:
            self.folder.give_tree_to_owner()
        self.checkpoint_file = self.work_dir / CHECKPOINT_NAME
        self.progress_file = self.work_dir / PROGRESS_NAME
        self.proc: subprocess.Popen[bytes] | None = None
        self.program_pid: int | None = None  # the program's own process (in a sandbox, not bwrap's)
        self.program: Pidfd | None = None  # the same, to signal without a reused pid's risk
        self.namespace: Pidfd | None = None  # the first process of its PID namespace
        self.uid_lease: UidLease | None = None
        self.bounds: ProgramBounds | None = None  # its memory bound and network, from its last start
        self.resume = False
        self.finished = False
        self._started_at = 0.0
        self._stderr_tail = ""
        self._metrics_offset = 0  # read from the start at each claim; re-read steps replace
        self._output: list[OutputTail] = []  # stdout's and stderr's pipes while the program runs
        # What this job may hold on the store (its checkpoints and result count too); watched
        # while its program runs, from another thread, which kills the program when passed.
        self.storage = ProgramStorage(ctx.storage, self.folder, self.work_dir)
        self._handles = threading.Lock()  # the program's handles, closed here, used by the watch

    # -- the contract ---------------------------------------------------------------------

    def ready(self, abandon: Callable[[], bool] | None = None) -> None:
        """Start the program before the slice's clock does, so that its start-up (an
        interpreter, its imports) counts as the switch's cost. Started inside the slice, a
        program slower to start than a slice is long would be asked to checkpoint before its
        handler was in place, slice after slice, and never get anywhere while it shares a GPU.
        An urgent job (`abandon()`) does not wait for the start: the program, not started yet, is
        killed, and starts again from the same checkpoint next time."""
        if self.proc is None and not self.finished:
            self._start(abandon)

    def step(self) -> float:
        if self.finished:
            return 1.0
        if self.proc is None:
            self._start()
        assert self.proc is not None
        try:
            code = self._exit_code(self.proc.wait(timeout=self.params["step_ms"] / 1000.0))
        except subprocess.TimeoutExpired:
            self.storage.report()
            return min(read_progress(self.folder), MAX_RUNNING_PROGRESS)
        self._reaped()
        self._raise_if_over_storage()
        if code == 0:
            self.finished = True
            return 1.0
        argv0, sandboxed = self.params["argv"][0], bool(self.sandbox.bwrap)
        raise exec_failure(code, self._stderr_tail, argv0, sandboxed=sandboxed) or self._failure(
            code, "unasked" if code == EX_TEMPFAIL else ""
        )

    def state_dict(self) -> bytes:
        if self.proc is None:
            # Not running: the state is the checkpoint it last wrote or was given, if any.
            if self.finished:
                if not self.folder.exists(CHECKPOINT_NAME):
                    raise RuntimeError("the program finished without writing a checkpoint")
                return self._read_checkpoint()
            return self._read_checkpoint() if self.resume else b""  # b"": resuming starts afresh
        before = self.folder.signature(CHECKPOINT_NAME)
        uptime = time.monotonic() - self._started_at
        if self.program is not None:
            self.program.send(signal.SIGUSR1)  # exited meanwhile: its code tells what happened
        try:
            code = self._exit_code(self.proc.wait(timeout=CHECKPOINT_TIMEOUT_S))
        except subprocess.TimeoutExpired:
            self._kill()
            self._raise_if_over_storage()
            raise RuntimeError(
                f"the program did not exit within {CHECKPOINT_TIMEOUT_S:g} s of SIGUSR1; killed it"
                f"{self._stderr_suffix()}"
            ) from None
        self._reaped()
        self._raise_if_over_storage()
        self.resume = True
        changed = self.folder.signature(CHECKPOINT_NAME) != before
        if code == EX_TEMPFAIL:
            if not changed:
                raise self._failure(code, f"exited {EX_TEMPFAIL} without writing {CHECKPOINT_NAME}")
            return self._read_checkpoint()
        if code == 0:
            self.finished = True
            if not self.folder.exists(CHECKPOINT_NAME):
                raise RuntimeError("the program finished during a checkpoint without writing a checkpoint")
            return self._read_checkpoint()
        if code == -signal.SIGUSR1 and not changed and uptime < STARTUP_GRACE_S:
            log.warning("job %s: program killed by SIGUSR1 before its handler was in place", self.ctx.job_id)
            if self.folder.exists(CHECKPOINT_NAME):
                return self._read_checkpoint()
            self.resume = False
            return b""
        raise self._failure(code, "during a checkpoint")

    def load_state_dict(self, state: bytes) -> None:
        self._stop()
        self.finished = False
        if not state:
            self.folder.unlink(CHECKPOINT_NAME)
            self.resume = False
            return
        # Given to the program's uid, which reads it on resume; whatever the program left at
        # the temporary name is replaced, never written through.
        self.folder.write_atomic(CHECKPOINT_NAME, state)
        self.resume = True

    def metrics(self) -> list[tuple[int, str, float]]:
        """The complete lines the program appended to CLOCKQ_METRICS_FILE since the last call."""
        records, self._metrics_offset = read_metrics(self.folder, self._metrics_offset)
        return records

    def write_result(self, directory: Path) -> None:
        """Copy the files the program left in CLOCKQ_RESULT_DIR, if they fit what the job may store."""
        copy_result(self.folder, directory, self.storage.check_result_fits)

    def close(self) -> None:
        self._stop()
        if hasattr(self, "folder"):  # set up
            self.folder.close()

    def declared_gpu_util(self) -> float | None:
        return None

    # -- the process ----------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.program_pid

    def _start(self, abandon: Callable[[], bool] | None = None) -> None:
        if not self.resume:
            self.folder.unlink(CHECKPOINT_NAME)
            self.folder.unlink(PROGRESS_NAME)
        self._take_uid()
        argv = list(self.params["argv"]) + (["--resume"] if self.resume else [])
        # The program is the user's code: it gets no credentials to clockq's own services.
        env = program_environment(dict(os.environ))
        env.update(self.sandbox.env(self.work_dir, self.folder.owner))
        env.update(
            CLOCKQ_CHECKPOINT_FILE=str(self.checkpoint_file),
            CLOCKQ_PROGRESS_FILE=str(self.progress_file),
            CLOCKQ_JOB_ID=str(self.ctx.job_id),
            CLOCKQ_WORK_DIR=str(self.work_dir),
            CLOCKQ_RESULT_DIR=str(self.work_dir / RESULT_DIR_NAME),
            CLOCKQ_METRICS_FILE=str(self.work_dir / METRICS_NAME),
        )
        if self.resume:
            env["CLOCKQ_RESUME"] = "1"
        if why := program_problem(argv[0], env.get("PATH", os.defpath), self.work_dir):
            self._release_uid()
            raise cannot_start(argv[0], why)
        try:
            keep = settings.CLOCKQ_COMMAND_LOG_KEEP_KB * 1024
            self._output = [OutputTail(keep, kept_log(self.folder, name, keep)) for name in (STDOUT_NAME, STDERR_NAME)]
            info_read, info_write = os.pipe() if self.sandbox.bwrap else (None, None)
            # The sandbox waits on block_read, set up, until its memory cgroup and network are in place.
            block_read, block_write = os.pipe() if self.sandbox.bwrap else (None, None)
            try:
                self.proc = subprocess.Popen(
                    self.sandbox.argv(argv, work_dir=self.work_dir, info_fd=info_write, block_fd=block_read),
                    stdin=subprocess.DEVNULL,
                    stdout=self._output[0].write_fd,
                    stderr=self._output[1].write_fd,
                    cwd=self.work_dir,
                    env=env,
                    pass_fds=tuple(fd for fd in (info_write, block_read) if fd is not None),
                    **self.sandbox.popen_kwargs(self.folder.owner),
                )
            finally:
                for fd in (info_write, block_read):
                    if fd is not None:
                        os.close(fd)
        except OSError as exc:
            for fd in (info_read, block_write):
                if fd is not None:
                    os.close(fd)
            self._close_output()
            self._release_uid()
            raise start_error(exc, argv[0], sandboxed=bool(self.sandbox.bwrap)) from exc
        for tail in self._output:
            tail.started()
        self.storage.start_watch(self._stop_for_storage)
        self._started_at = time.monotonic()
        if info_read is None:
            self.program_pid = self.proc.pid
            held = self.program = Pidfd.open(self.program_pid)
        else:
            # None: bwrap could not set the sandbox up, and its exit says why.
            held = self.namespace = Pidfd.open(read_child_pid(info_read))
        self.bounds = None
        if held is not None:
            try:
                self.bounds = ProgramBounds.hold(
                    self.sandbox, job_id=self.ctx.job_id, uid=self.folder.owner, target=held, block_fd=block_write
                )
            except Exception:
                self._kill()
                raise
        elif block_write is not None:
            os.close(block_write)
        if info_read is not None:
            self.program_pid = first_child(self.namespace, self.proc) if self.namespace else None
            self.program = Pidfd.open(self.program_pid)
        self._await_handler(abandon)

    def _take_uid(self) -> None:
        """A uid for this run of the program that no other running program has: the job's own
        unless another job that maps to it runs now; then the folder is given to the other."""
        self.uid_lease = self.sandbox.lease_uid(self.ctx.job_id)
        if self.uid_lease is not None and self.uid_lease.uid != self.folder.owner:
            log.info("job %s: its program runs as uid %s this time", self.ctx.job_id, self.uid_lease.uid)
            self.folder.owner = self.uid_lease.uid
        if self.folder.owner is not None and self.folder.owned_by() != self.folder.owner:
            self.folder.give_tree_to_owner()

    def _release_uid(self) -> None:
        if self.uid_lease is not None:
            self.uid_lease.release()
            self.uid_lease = None

    def _await_handler(self, abandon: Callable[[], bool] | None) -> None:
        """Wait until the program has installed its SIGUSR1 handler, as the kernel shows in
        /proc/PID/status, or has exited, for at most HANDLER_WAIT_S: a SIGUSR1 sent before then
        would kill it. Bounded, so that a program that never installs one does not hold up the
        claim; an urgent job (`abandon()`) ends it at once. Where /proc cannot tell, it does not wait."""
        assert self.proc is not None
        while self.program_pid is not None and time.monotonic() - self._started_at < HANDLER_WAIT_S:
            if catches_signal(self.program_pid, signal.SIGUSR1) is not False:
                return
            if abandon is not None and abandon():
                self._kill()
                raise StartAbandoned("while its program started")
            try:
                self.proc.wait(timeout=HANDLER_POLL_S)
                return  # exited: step() reads its code
            except subprocess.TimeoutExpired:
                pass

    def _exit_code(self, code: int) -> int:
        """The program's exit code, negative for death by a signal, as Popen gives it. bwrap
        passes on a code, or 128 + the signal that killed the program, as a shell does."""
        if self.sandbox.bwrap and code > 128 and code - 128 < signal.NSIG:
            return -(code - 128)
        return code

    def _reaped(self) -> None:
        """The program's first process has exited: end what it left (in a sandbox, the PID
        namespace ends with its first process), keep the end of its stderr, forget it."""
        assert self.proc is not None
        self._end_sandbox()
        self.storage.stop_watch()
        with self._handles:
            self.proc = None
            self.program_pid = None
            for handle in (self.program, self.namespace):
                if handle is not None:
                    handle.close()
            self.program = self.namespace = None
        self._stderr_tail = self._output[1].recent(STDERR_TAIL_BYTES).decode("utf-8", "replace") if self._output else ""
        self._close_output()
        self._release_uid()
        self.storage.report(force=True)

    def _end_sandbox(self) -> None:
        """Kill every process the program started, and wait for the sandbox to be gone."""
        assert self.proc is not None
        if self.bounds is not None:
            self.bounds.stop()
        if self.namespace is not None:
            # The death of a PID namespace's first process makes the kernel kill every other
            # process in it, and that first process is gone only once all of them are.
            self.namespace.send(signal.SIGKILL)
            self.namespace.wait()
        elif not self.sandbox.bwrap:
            _killpg(self.proc.pid)  # unsandboxed: its process group is all that can be found
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.bounds is not None:
            self.bounds.close()  # its memory verdict stays, for the job's reason

    def _kill(self) -> None:
        self._reaped()

    def _stop(self) -> None:
        if self.proc is not None:
            self._kill()

    def _close_output(self) -> None:
        """The program is gone: keep the end of its output in the work folder's logs."""
        output, self._output = self._output, []
        for name, tail in zip((STDOUT_NAME, STDERR_NAME), output, strict=False):
            kept = tail.finish()
            try:
                self.folder.write_atomic(name, kept)
            except OSError as exc:
                # The store is full or failing: the log is lost, the job's work is not.
                log.warning("job %s: could not keep its %s: %s", self.ctx.job_id, name, exc)

    # -- the storage it holds ---------------------------------------------------------------

    def _stop_for_storage(self) -> None:
        """From the watch's thread: the program passed a storage bound. End it now; the main
        thread, waiting on it, finds out why."""
        log.warning("job %s: stopping its program: %s", self.ctx.job_id, self.storage.over)
        with self._handles:
            if self.namespace is not None:
                self.namespace.send(signal.SIGKILL)
            elif self.proc is not None:
                if not self.sandbox.bwrap:
                    _killpg(self.proc.pid)
                self.proc.kill()

    def _raise_if_over_storage(self) -> None:
        if reason := self.storage.take_over():
            self.storage.clear_after_over(keep=(STDOUT_NAME, STDERR_NAME), job_id=self.ctx.job_id)
            raise StorageLimitExceeded(f"the program was stopped: {reason}{self._stderr_suffix()}")

    def _read_checkpoint(self) -> bytes:
        return read_checkpoint(self.folder, self.storage.checkpoint_too_big)

    def _failure(self, code: int, context: str) -> Exception:
        if self.bounds is not None and (over := self.bounds.memory_verdict):
            return MemoryLimitExceeded(f"{over}{self._stderr_suffix()}")
        what = f"killed by signal {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        return RuntimeError(f"the program {what}{f' ({context})' if context else ''}{self._stderr_suffix()}")

    def _stderr_suffix(self) -> str:
        tail = self._stderr_tail
        return f"; stderr ends:\n{tail}" if tail.strip() else "; stderr is empty"


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)
