"""The supervisor's stop order: the other children first, then what must still reach the broker
(`before_last`: runstack gives up its worker names there), then the broker itself."""

from __future__ import annotations

import sys

from clockq.stack.supervisor import Child, Supervisor

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def test_before_last_runs_once_the_others_stopped_and_while_the_broker_still_runs():
    worker, broker = Child("worker", SLEEPER), Child("broker", SLEEPER, stop_last=True)
    seen: list[tuple[int | None, int | None]] = []
    supervisor = Supervisor(
        [broker, worker], stop_grace_s=10, before_last=lambda: seen.append((worker.proc.poll(), broker.proc.poll()))
    )
    supervisor.start_all()
    try:
        assert worker.proc.poll() is None and broker.proc.poll() is None
    finally:
        supervisor.stop_all()

    ((worker_code, broker_code),) = seen
    assert worker_code is not None  # the worker had stopped
    assert broker_code is None  # the broker still ran
    assert broker.proc.poll() is not None  # and is stopped at the end


def test_a_failing_before_last_still_stops_the_broker():
    broker = Child("broker", SLEEPER, stop_last=True)

    def fails():
        raise RuntimeError("the broker refused")

    supervisor = Supervisor([broker], stop_grace_s=10, before_last=fails)
    supervisor.start_all()
    supervisor.stop_all()
    assert broker.proc.poll() is not None
