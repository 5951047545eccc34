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
    HOME, a private ``/tmp``, stdin from /dev/null, and stdout and stderr appended to
    ``stdout.log`` and ``stderr.log`` in that folder (a link or anything but a file of the
    job's put in their place is replaced by a new, empty log). The environment is the worker's, less clockq's
    credentials (DATABASE_URL, REDIS_URL, SECRET_KEY, ...), with ``CUDA_VISIBLE_DEVICES`` left
    as inherited (the worker's GPU), plus:

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

``tests/workloads/fixtures/count_script.py`` is a complete example to copy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings

from clockq.jobs.results import MAX_FILES as MAX_RESULT_FILES
from clockq.jobs.results import SAFE_NAME as SAFE_RESULT_NAME
from clockq.jobs.results import ResultError
from workers.job_folder import JobFolder, UnsafeEntry
from workers.sandbox import Pidfd, UidLease, first_child, prepare_work_dir, read_child_pid, sandbox_for_commands
from workers.workloads.base import RunContext, StartAbandoned, Workload
from workers.workloads.program_start import cannot_start, catches_signal, exec_failure, program_problem, start_error

log = logging.getLogger(__name__)

EX_TEMPFAIL = 75
CHECKPOINT_TIMEOUT_S = 60.0
STARTUP_GRACE_S = 10.0
HANDLER_WAIT_S = 2.0  # ample for an interpreter's start; a program that installs none goes on
HANDLER_POLL_S = 0.002
STDERR_TAIL_BYTES = 2048
MAX_RUNNING_PROGRESS = 0.999

# Settings a job's program must not see: clockq's database, broker (address and password),
# secrets, ports and every other clockq, Celery, Django and Flower setting.
WITHHELD_ENV = frozenset({"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "PORT"})
WITHHELD_ENV_PREFIXES = ("CLOCKQ_", "CELERY", "DJANGO_", "FLOWER_")


def program_environment(worker_env: dict[str, str]) -> dict[str, str]:
    """The worker's environment less everything of clockq's: what a program may inherit (PATH,
    locale, CUDA_VISIBLE_DEVICES, its own libraries' settings)."""
    return {
        name: value
        for name, value in worker_env.items()
        if name not in WITHHELD_ENV and not name.startswith(WITHHELD_ENV_PREFIXES)
    }


CHECKPOINT_NAME = "checkpoint"
PROGRESS_NAME = "progress"
STDOUT_NAME = "stdout.log"
RESULT_DIR_NAME = "result"
METRICS_NAME = "metrics.jsonl"
METRICS_READ_BYTES = 1 << 20
STDERR_NAME = "stderr.log"


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
        self.resume = False
        self.finished = False
        self._started_at = 0.0
        self._stderr_offset = 0
        self._stderr_tail = ""
        self._metrics_offset = 0  # read from the start at each claim; re-read steps replace
        self._logs: list[int] = []  # stdout's and stderr's descriptors while the program runs

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
            return min(self._read_progress(), MAX_RUNNING_PROGRESS)
        self._reaped()
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
            raise RuntimeError(
                f"the program did not exit within {CHECKPOINT_TIMEOUT_S:g} s of SIGUSR1; killed it"
                f"{self._stderr_suffix()}"
            ) from None
        self._reaped()
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
        """The complete lines the program appended to CLOCKQ_METRICS_FILE since the last call, at
        most METRICS_READ_BYTES at a time. The file is the program's, so it is opened without
        following a link, and a line that is not a JSON object with an integer `step` is skipped."""
        try:
            fd = self.folder.open_file(METRICS_NAME)
        except OSError:
            return []  # none yet (or a link, or not the job's: nothing is read through it)
        with os.fdopen(fd, "rb") as fh:
            fh.seek(self._metrics_offset)
            chunk = fh.read(METRICS_READ_BYTES)
        end = chunk.rfind(b"\n") + 1  # only whole lines; the rest is read next time
        self._metrics_offset += end
        records = []
        for line in chunk[:end].splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and isinstance(step := entry.pop("step", None), int):
                records += [(step, str(name), value) for name, value in entry.items()]
        return records

    def write_result(self, directory: Path) -> None:
        """Copy the files the program left in CLOCKQ_RESULT_DIR. The program owns that folder and
        may have swapped anything in it for a link, so nothing is opened by path: the folder and
        each file are opened relative to their folder, never following a link, and only the
        job's own regular files are copied (workers/job_folder.py). Otherwise a link to a file
        only the worker may read would hand that file to the job's owner."""
        try:
            folder = self.folder.subfolder(RESULT_DIR_NAME)
        except FileNotFoundError:
            return  # no result
        except OSError as exc:
            raise ResultError(f"{RESULT_DIR_NAME}/ in the work folder is not a folder: {exc}") from exc
        with folder:
            names = sorted(folder.names())
            if len(names) > MAX_RESULT_FILES:
                raise ResultError(
                    f"a result holds at most {MAX_RESULT_FILES} files; {RESULT_DIR_NAME}/ has {len(names)}"
                )
            for name in names:
                if not SAFE_RESULT_NAME.match(name):
                    raise ResultError(f"result file name {name[:60]!r} is not allowed (letters, digits, . _ -)")
                try:
                    folder.copy_to(name, directory / name)
                except OSError as exc:
                    raise ResultError(
                        f"result entry {name[:60]!r} cannot be read (links, folders and files not "
                        f"the job's own are refused): {exc.strerror or exc}"
                    ) from exc

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
            self._logs = [self.folder.open_log(STDOUT_NAME), self.folder.open_log(STDERR_NAME)]
            self._stderr_offset = os.fstat(self._logs[1]).st_size
            info_read, info_write = os.pipe() if self.sandbox.bwrap else (None, None)
            try:
                self.proc = subprocess.Popen(
                    self.sandbox.argv(argv, work_dir=self.work_dir, info_fd=info_write),
                    stdin=subprocess.DEVNULL,
                    stdout=self._logs[0],
                    stderr=self._logs[1],
                    cwd=self.work_dir,
                    env=env,
                    pass_fds=() if info_write is None else (info_write,),
                    **self.sandbox.popen_kwargs(self.folder.owner),
                )
            finally:
                if info_write is not None:
                    os.close(info_write)
        except OSError as exc:
            self._close_logs()
            self._release_uid()
            raise start_error(exc, argv[0], sandboxed=bool(self.sandbox.bwrap)) from exc
        self._started_at = time.monotonic()
        if info_read is None:
            self.program_pid = self.proc.pid
        else:
            # None: bwrap could not set the sandbox up, and its exit says why.
            self.namespace = Pidfd.open(read_child_pid(info_read))
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
        self.proc = None
        self.program_pid = None
        for handle in (self.program, self.namespace):
            if handle is not None:
                handle.close()
        self.program = self.namespace = None
        self._stderr_tail = _tail(self._logs[1], self._stderr_offset, STDERR_TAIL_BYTES) if self._logs else ""
        self._close_logs()
        self._release_uid()

    def _end_sandbox(self) -> None:
        """Kill every process the program started, and wait for the sandbox to be gone."""
        assert self.proc is not None
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

    def _kill(self) -> None:
        self._reaped()

    def _stop(self) -> None:
        if self.proc is not None:
            self._kill()

    def _close_logs(self) -> None:
        for fd in self._logs:
            os.close(fd)
        self._logs = []

    def _read_progress(self) -> float:
        try:
            raw = self.folder.read(PROGRESS_NAME, limit=64)
            value = float((raw or b"").decode("utf-8", errors="replace").strip())
        except (OSError, ValueError):
            return 0.0
        return min(max(value, 0.0), 1.0) if math.isfinite(value) else 0.0

    def _read_checkpoint(self) -> bytes:
        try:
            data = self.folder.read(CHECKPOINT_NAME)
        except UnsafeEntry as exc:
            raise RuntimeError(f"the program's {CHECKPOINT_NAME} cannot be used: {exc.strerror}") from None
        if not data:
            raise RuntimeError(f"the program wrote an empty {CHECKPOINT_NAME}")
        return data

    def _failure(self, code: int, context: str) -> RuntimeError:
        what = f"killed by signal {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        return RuntimeError(f"the program {what}{f' ({context})' if context else ''}{self._stderr_suffix()}")

    def _stderr_suffix(self) -> str:
        tail = self._stderr_tail
        return f"; stderr ends:\n{tail}" if tail.strip() else "; stderr is empty"


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _tail(fd: int, offset: int, limit: int) -> str:
    """The end of what was written to `fd` since `offset`, read back through the worker's own
    descriptor: never through whatever the program has put at the log's name since."""
    try:
        size = os.fstat(fd).st_size
        start = max(offset, size - limit)
        return os.pread(fd, limit, start).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)
