"""Start, watch, restart and stop a set of child processes.

Used by `gpuworkers` (one Celery worker per GPU, restarted when it dies) and by `runstack`
(the whole single-machine system): a part of the core that both the launcher (clockq/stack/)
and the gpu role (workers/) may use, which imports neither. Each child runs in its own process
group, so stopping it reaches its own children too (a Celery worker's pool), and nothing else.

Nothing it starts outlives it, whatever kills it, SIGKILL included:

- each child gets SIGTERM from the kernel when the supervisor dies (PR_SET_PDEATHSIG), and stops
  as it would on a Ctrl-C: a `gpuworkers` stops its workers, Celery its pool, gunicorn its
  workers. The kernel sends it when the *thread* that forked the child ends, so children are
  started from the main thread only;
- with a `record_dir`, it writes down each child by pid and start time, and starts an
  undertaker (clockq/supervision/records.py) that learns of its death through a pipe and, after
  `stop_grace_s`, kills what is left (a child that hung and ignored the SIGTERM, or a
  grandchild that outlived its parent). A later start reads the same record to stop what is
  left when the undertaker was killed too.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from clockq.supervision import procs, records

log = logging.getLogger("clockq.supervisor")

_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: a forked child should not dlopen
_PR_SET_PDEATHSIG = 1


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    restart: bool = True  # False: if it dies, the whole supervisor stops
    stop_last: bool = False  # infrastructure (the broker) that the others need while stopping
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    next_start_at: float = 0.0


class Supervisor:
    MAX_BACKOFF_S = 30.0
    HEALTHY_AFTER_S = 60.0  # a child that ran this long gets its backoff reset

    def __init__(
        self,
        children: list[Child],
        *,
        stop_grace_s: float = 30.0,
        before_last: Callable[[], None] | None = None,
        name: str = "supervisor",
        record_dir: Path | None = None,
    ):
        self.children = children
        self.stop_grace_s = stop_grace_s
        # Run once the others have stopped, before those marked `stop_last` (the broker): what
        # still needs the broker to let go (the launcher's worker names).
        self.before_last = before_last
        self.name = name
        self.record_dir = record_dir
        self.record_path: Path | None = None
        self.undertaker: subprocess.Popen | None = None
        self._undertaker_pipe: int | None = None
        self.stopping = False
        self.failed: str | None = None

    def start_all(self) -> None:
        """Start the undertaker (with a `record_dir`), then every child. From the main thread."""
        if self.record_dir is not None:
            self._start_undertaker(self.record_dir)
        for child in self.children:
            self._start(child)

    def _start_undertaker(self, record_dir: Path) -> None:
        """A process of its own session (a kill of the supervisor's group does not reach it), which
        holds the read end of a pipe: the supervisor alone holds the write end, so the pipe ends
        exactly when the supervisor does."""
        self.record_path = records.write_record(record_dir, self.name, {})
        read_end, self._undertaker_pipe = os.pipe()  # neither end is inherited by the children
        script = Path(records.__file__)
        argv = [sys.executable, str(script), "watch", str(read_end), str(self.record_path), str(self.stop_grace_s)]
        try:
            self.undertaker = subprocess.Popen(argv, pass_fds=(read_end,), start_new_session=True)
        finally:
            os.close(read_end)
        log.info("started its undertaker (pid %s)", self.undertaker.pid)

    def _start(self, child: Child) -> None:
        if threading.current_thread() is not threading.main_thread():
            # PR_SET_PDEATHSIG fires when the forking thread ends, not the process: a child
            # forked here would be killed with this thread, or outlive the supervisor.
            raise RuntimeError(f"{self.name} must start {child.name} from the main thread")
        child.proc = subprocess.Popen(
            child.argv,
            env={**os.environ, **child.env},
            start_new_session=True,
            preexec_fn=_die_with(os.getpid()),
        )
        child.started_at = time.monotonic()
        self._record()
        log.info("started %s (pid %s)", child.name, child.proc.pid)

    def _record(self) -> None:
        """Rewrite the record with the children running now (a restarted one has a new pid)."""
        if self.record_dir is None:
            return
        running = {}
        for child in self.children:
            if child.proc is not None and (who := procs.identity(child.proc.pid)) is not None:
                running[child.name] = who
        records.write_record(self.record_dir, self.name, running)

    def poll_once(self) -> bool:
        """Restart or give up on children that died. Returns False once the supervisor must stop."""
        now = time.monotonic()
        for child in self.children:
            if child.proc is None:
                if now >= child.next_start_at and not self.stopping:
                    self._start(child)
                continue
            code = child.proc.poll()
            if code is None:
                continue
            if not child.restart:
                self.failed = f"{child.name} exited with code {code}"
                log.error("%s; stopping everything", self.failed)
                return False
            if now - child.started_at >= self.HEALTHY_AFTER_S:
                child.restarts = 0
            backoff = min(2.0**child.restarts, self.MAX_BACKOFF_S)
            child.restarts += 1
            child.proc = None
            child.next_start_at = now + backoff
            log.warning("%s exited with code %s; restarting in %.0f s", child.name, code, backoff)
        return True

    def stop_all(self) -> None:
        """Stop the children, those marked `stop_last` after all the others."""
        self.stopping = True
        self._stop([c for c in self.children if not c.stop_last])
        if self.before_last is not None:
            try:
                self.before_last()
            except Exception:  # the broker must still be stopped
                log.exception("stopping: the step before the last children failed")
        self._stop([c for c in self.children if c.stop_last])
        self._release_undertaker()

    def _release_undertaker(self) -> None:
        """Everything is stopped: remove the record, so the undertaker finds nothing to do when
        the pipe ends, and end the pipe."""
        if self.record_path is not None:
            self.record_path.unlink(missing_ok=True)
        if self._undertaker_pipe is not None:
            os.close(self._undertaker_pipe)
            self._undertaker_pipe = None
        if self.undertaker is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.undertaker.wait(timeout=10)

    def _stop(self, children: list[Child]) -> None:
        """SIGTERM each child's process group, wait for a grace period, then SIGKILL."""
        running = [(c.name, c.proc) for c in children if c.proc is not None and c.proc.poll() is None]
        for _name, proc in running:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        for name, proc in running:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0f s; killing it", name, self.stop_grace_s)
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
            # Reap the rest of its group too (pool children left behind by a killed parent).
            _signal_group(proc, signal.SIGKILL)

    def run_forever(self, poll_s: float = 0.5) -> int:
        """Start everything, supervise until SIGINT/SIGTERM or a fatal exit, then stop all."""
        received: list[int] = []
        # The signal wakes the wait between polls at once (a byte down this pipe), rather than
        # at the next poll: a plain sleep is resumed after a handler runs (PEP 475).
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)

        def on_signal(signum, _frame):
            received.append(signum)
            with contextlib.suppress(OSError):  # a full pipe is already a wake-up
                os.write(wake_write, b"\0")

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start_all()
        try:
            while not received and self.poll_once():
                select.select([wake_read], [], [], poll_s)
        finally:
            self.stop_all()
            os.close(wake_read)
            os.close(wake_write)
        return 1 if self.failed else 0


def _die_with(supervisor_pid: int) -> Callable[[], None]:
    """preexec_fn: the child gets SIGTERM when the supervisor dies, even by SIGKILL (Linux).
    A supervisor that died before the prctl took effect leaves the child its parent no longer:
    it exits at once instead of running unsupervised."""

    def set_death_signal() -> None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != supervisor_pid:
            os._exit(1)

    return set_death_signal


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
