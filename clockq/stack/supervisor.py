"""Start, watch, restart and stop a set of child processes.

Used by `gpuworkers` (one Celery worker per GPU, restarted when it dies) and by `runstack`
(the whole single-machine system). Each child runs in its own process group, so stopping it
reaches its own children too (a Celery worker's pool), and nothing else.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("clockq.supervisor")


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
        self, children: list[Child], *, stop_grace_s: float = 30.0, before_last: Callable[[], None] | None = None
    ):
        self.children = children
        self.stop_grace_s = stop_grace_s
        # Run once the others have stopped, before those marked `stop_last` (the broker): what
        # still needs the broker to let go (the launcher's worker names).
        self.before_last = before_last
        self.stopping = False
        self.failed: str | None = None

    def start_all(self) -> None:
        for child in self.children:
            self._start(child)

    def _start(self, child: Child) -> None:
        child.proc = subprocess.Popen(child.argv, env={**os.environ, **child.env}, start_new_session=True)
        child.started_at = time.monotonic()
        log.info("started %s (pid %s)", child.name, child.proc.pid)

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

        def on_signal(signum, _frame):
            received.append(signum)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start_all()
        try:
            while not received and self.poll_once():
                time.sleep(poll_s)
        finally:
            self.stop_all()
        return 1 if self.failed else 0


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
