"""Run an external program, so users can bring existing training scripts. Submitting one needs
the `run command` permission; it runs in a sandbox (workers/sandbox.py): as an unprivileged
user, with resource limits, and with no credentials to clockq.

The program and clockq talk through a small protocol. Write scripts against it exactly:

Start
    clockq runs ``argv`` (no shell) in its own session and process group, as the user
    CLOCKQ_COMMAND_USER, with the job's work folder (its only writable place) as the current
    directory and HOME, stdin from /dev/null, and stdout and stderr appended to ``stdout.log``
    and ``stderr.log`` in that folder. The environment is the worker's, less clockq's
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
    kills its process group and the checkpoint fails. After a checkpoint the program is
    stopped; if the job keeps running, clockq starts it again with ``--resume``.

    Install the ``SIGUSR1`` handler first thing, before heavy imports. clockq waits up to 2
    seconds after each start for the handler to be in place (it reads the process's caught
    signals from /proc) before it goes on; at a claim, that wait counts as the switch's cost,
    not the slice's. If an RT job wants the GPU meanwhile, the program is killed (SIGKILL to its
    group) and starts again from the same checkpoint later. A program killed by ``SIGUSR1``
    within its first 10 seconds, before its handler was in place, is treated as not started
    yet: the checkpoint is the one it started from (none on a fresh start) and it starts again
    next time. Killed by ``SIGUSR1`` later, it fails.

Exit
    Exit code 0 means done. Exit code 75 is only an answer to ``SIGUSR1``. Any other exit code,
    75 unasked, or death by a signal fails the job, with the exit code and the last 2 KB of
    the program's stderr in the error. If a program may finish while a checkpoint is being
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
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from django.conf import settings

from clockq.jobs.results import MAX_FILES as MAX_RESULT_FILES
from clockq.jobs.results import SAFE_NAME as SAFE_RESULT_NAME
from clockq.jobs.results import ResultError
from workers.sandbox import prepare_work_dir, sandbox_for_commands
from workers.workloads.base import RunContext, StartAbandoned, Workload

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
        prepare_work_dir(self.work_dir, Path(settings.CLOCKQ_CHECKPOINT_DIR), self.sandbox)
        self.checkpoint_file = self.work_dir / CHECKPOINT_NAME
        self.progress_file = self.work_dir / PROGRESS_NAME
        self.stderr_file = self.work_dir / STDERR_NAME
        self.proc: subprocess.Popen[bytes] | None = None
        self.resume = False
        self.finished = False
        self._started_at = 0.0
        self._stderr_offset = 0
        self._metrics_offset = 0  # read from the start at each claim; re-read steps replace
        self._files: list[IO[bytes]] = []

    # -- the contract ---------------------------------------------------------------------

    def ready(self, abandon: Callable[[], bool] | None = None) -> None:
        """Start the program before the slice's clock does, so that its start-up (an
        interpreter, its imports) counts as the switch's cost. Started inside the slice, a
        program slower to start than a slice is long would be asked to checkpoint before its
        handler was in place, slice after slice, and never get anywhere while it shares a GPU.
        An RT job (`abandon()`) does not wait for the start: the program, not started yet, is
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
            code = self.proc.wait(timeout=self.params["step_ms"] / 1000.0)
        except subprocess.TimeoutExpired:
            return min(self._read_progress(), MAX_RUNNING_PROGRESS)
        self._reaped()
        if code == 0:
            self.finished = True
            return 1.0
        raise self._failure(code, "unasked" if code == EX_TEMPFAIL else "")

    def state_dict(self) -> bytes:
        if self.proc is None:
            # Not running: the state is the checkpoint it last wrote or was given, if any.
            if self.finished:
                if not self.checkpoint_file.exists():
                    raise RuntimeError("the program finished without writing a checkpoint")
                return self._read_checkpoint()
            return self._read_checkpoint() if self.resume else b""  # b"": resuming starts afresh
        before = _signature(self.checkpoint_file)
        uptime = time.monotonic() - self._started_at
        with contextlib.suppress(ProcessLookupError):  # exited meanwhile: its code tells what happened
            self.proc.send_signal(signal.SIGUSR1)
        try:
            code = self.proc.wait(timeout=CHECKPOINT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._kill()
            raise RuntimeError(
                f"the program did not exit within {CHECKPOINT_TIMEOUT_S:g} s of SIGUSR1; killed it"
                f"{self._stderr_suffix()}"
            ) from None
        self._reaped()
        self.resume = True
        changed = _signature(self.checkpoint_file) != before
        if code == EX_TEMPFAIL:
            if not changed:
                raise self._failure(code, f"exited {EX_TEMPFAIL} without writing {CHECKPOINT_NAME}")
            return self._read_checkpoint()
        if code == 0:
            self.finished = True
            if not self.checkpoint_file.exists():
                raise RuntimeError("the program finished during a checkpoint without writing a checkpoint")
            return self._read_checkpoint()
        if code == -signal.SIGUSR1 and not changed and uptime < STARTUP_GRACE_S:
            log.warning("job %s: program killed by SIGUSR1 before its handler was in place", self.ctx.job_id)
            if self.checkpoint_file.exists():
                return self._read_checkpoint()
            self.resume = False
            return b""
        raise self._failure(code, "during a checkpoint")

    def load_state_dict(self, state: bytes) -> None:
        self._stop()
        self.finished = False
        if not state:
            self.checkpoint_file.unlink(missing_ok=True)
            self.resume = False
            return
        tmp = self.checkpoint_file.with_name(CHECKPOINT_NAME + ".clockq-tmp")
        with open(tmp, "wb") as f:
            f.write(state)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.checkpoint_file)
        self.sandbox.hand_over(self.checkpoint_file)  # the program reads it on resume
        self.resume = True

    def metrics(self) -> list[tuple[int, str, float]]:
        """The complete lines the program appended to CLOCKQ_METRICS_FILE since the last call, at
        most METRICS_READ_BYTES at a time. The file is the program's, so it is opened without
        following a link, and a line that is not a JSON object with an integer `step` is skipped."""
        try:
            fd = os.open(self.work_dir / METRICS_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return []  # none yet (or a link: nothing is read through it)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return []
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
        may have swapped anything in it for a link, so nothing is opened by path: the folder is
        opened relative to the work folder, and each file relative to it, never following a
        link (O_NOFOLLOW). Otherwise a link to a file only the worker may read would hand that
        file to the job's owner."""
        work = os.open(self.work_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            try:
                folder = os.open(RESULT_DIR_NAME, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=work)
            except FileNotFoundError:
                return  # no result
            except OSError as exc:
                raise ResultError(f"{RESULT_DIR_NAME}/ in the work folder is not a folder: {exc}") from exc
            try:
                names = sorted(os.listdir(folder))
                if len(names) > MAX_RESULT_FILES:
                    raise ResultError(
                        f"a result holds at most {MAX_RESULT_FILES} files; {RESULT_DIR_NAME}/ has {len(names)}"
                    )
                for name in names:
                    if not SAFE_RESULT_NAME.match(name):
                        raise ResultError(f"result file name {name[:60]!r} is not allowed (letters, digits, . _ -)")
                    _copy_no_follow(folder, name, directory / name)
            finally:
                os.close(folder)
        finally:
            os.close(work)

    def close(self) -> None:
        self._stop()

    def declared_gpu_util(self) -> float | None:
        return None

    # -- the process ----------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def _start(self, abandon: Callable[[], bool] | None = None) -> None:
        if not self.resume:
            self.checkpoint_file.unlink(missing_ok=True)
            self.progress_file.unlink(missing_ok=True)
        argv = list(self.params["argv"]) + (["--resume"] if self.resume else [])
        # The program is the user's code: it gets no credentials to clockq's own services.
        env = program_environment(dict(os.environ))
        env.update(self.sandbox.env(self.work_dir))
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
        stdout = open(self.work_dir / STDOUT_NAME, "ab")  # noqa: SIM115 - closed in _reaped
        stderr = open(self.stderr_file, "ab")  # noqa: SIM115 - closed in _reaped
        self._files = [stdout, stderr]
        self._stderr_offset = stderr.tell()
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                cwd=self.work_dir,
                env=env,
                start_new_session=True,
                **self.sandbox.popen_kwargs(),
            )
        except OSError as exc:
            self._close_files()
            raise RuntimeError(f"could not start {argv[0]!r}: {exc}") from exc
        self._started_at = time.monotonic()
        self._await_handler(abandon)

    def _await_handler(self, abandon: Callable[[], bool] | None) -> None:
        """Wait until the program has installed its SIGUSR1 handler, as the kernel shows in
        /proc/PID/status, or has exited, for at most HANDLER_WAIT_S: a SIGUSR1 sent before then
        would kill it. Bounded, so that a program that never installs one does not hold up the
        claim; an RT job (`abandon()`) ends it at once. Where /proc cannot tell, it does not wait."""
        assert self.proc is not None
        while time.monotonic() - self._started_at < HANDLER_WAIT_S:
            if catches_signal(self.proc.pid, signal.SIGUSR1) is not False:
                return
            if abandon is not None and abandon():
                self._kill()
                raise StartAbandoned("while its program started")
            try:
                self.proc.wait(timeout=HANDLER_POLL_S)
                return  # exited: step() reads its code
            except subprocess.TimeoutExpired:
                pass

    def _reaped(self, *, group_killed: bool = False) -> None:
        """The main process has exited: kill anything it left in its group, forget it."""
        assert self.proc is not None
        if not group_killed:
            _killpg(self.proc.pid)
        self.proc = None
        self._close_files()

    def _kill(self) -> None:
        assert self.proc is not None
        _killpg(self.proc.pid)
        self.proc.wait()
        self._reaped(group_killed=True)

    def _stop(self) -> None:
        if self.proc is not None:
            self._kill()

    def _close_files(self) -> None:
        for f in self._files:
            f.close()
        self._files = []

    def _read_progress(self) -> float:
        try:
            value = float(self.progress_file.read_text(encoding="utf-8", errors="replace").strip())
        except (OSError, ValueError):
            return 0.0
        return min(max(value, 0.0), 1.0) if math.isfinite(value) else 0.0

    def _read_checkpoint(self) -> bytes:
        data = self.checkpoint_file.read_bytes()
        if not data:
            raise RuntimeError(f"the program wrote an empty {CHECKPOINT_NAME}")
        return data

    def _failure(self, code: int, context: str) -> RuntimeError:
        what = f"killed by signal {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        return RuntimeError(f"the program {what}{f' ({context})' if context else ''}{self._stderr_suffix()}")

    def _stderr_suffix(self) -> str:
        tail = _tail(self.stderr_file, self._stderr_offset, STDERR_TAIL_BYTES)
        return f"; stderr ends:\n{tail}" if tail.strip() else "; stderr is empty"


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def catches_signal(pid: int, signum: int) -> bool | None:
    """Whether process `pid` has a handler for `signum` (the SigCgt mask in /proc/PID/status);
    None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _tail(path: Path, offset: int, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - limit))
            return f.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def _copy_no_follow(folder_fd: int, name: str, to: Path) -> None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_fd)
    except OSError as exc:
        raise ResultError(f"result entry {name[:60]!r} cannot be read (links are refused): {exc}") from exc
    with os.fdopen(fd, "rb") as source:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ResultError(f"result entry {name[:60]!r} is not a regular file")
        with open(to, "xb") as target:
            shutil.copyfileobj(source, target, 1 << 20)
