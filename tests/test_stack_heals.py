"""`make run`'s stack heals itself: kill -9 of its embedded broker, and every job still
finishes, none twice. (What it prints and what Flower lets through is checked on a restarted
stack, in tests/stack/test_dies_with_supervisor.py.) Real processes: the
whole `manage.py runstack` on free ports, with its own SQLite and broker in a temporary folder
(tests/stack/live_stack.py)."""

from __future__ import annotations

import itertools
import os
import signal
from datetime import datetime

import pytest

from tests.harness import wait_for
from tests.stack.live_stack import Stack

pytestmark = pytest.mark.integration


@pytest.fixture
def stack(tmp_path):
    running = Stack(tmp_path)
    try:
        yield running.start()
    finally:
        running.stop()
        print(f"--- runstack log (tail) ---\n{running.output()[-6000:]}")


def submit(stack: Stack, name: str) -> int:
    status, body = stack.request(
        "/api/jobs", {"name": name, "tier": "SP", "workload": "synthetic", "params": {"steps": 60, "step_ms": 10}}
    )
    assert status == 201, status
    return body["id"]


def test_kill_9_of_the_broker_restarts_it_and_every_job_finishes_once(stack):
    # Given jobs running and waiting
    ids = [submit(stack, f"before-{i}") for i in range(6)]
    first = stack.broker_pid()
    assert first

    # When the broker is killed
    os.kill(first, signal.SIGKILL)

    # Then the stack starts it again, its clients reconnect, and /healthz is 200 again
    wait_for(lambda: (stack.broker_pid() or first) != first, 30, interval=0.2, what="a new broker process")
    wait_for(lambda: stack.alive() and stack.healthy(), 60, interval=0.5, what="/healthz 200 again")
    ids += [submit(stack, f"after-{i}") for i in range(2)]

    # And every job finishes, none running twice
    def finished():
        return all(stack.request(f"/api/jobs/{i}")[1]["state"] == "succeeded" for i in ids)

    wait_for(finished, 120, interval=1.0, what="every job to finish")
    for job_id in ids:
        _status, job = stack.request(f"/api/jobs/{job_id}?history=1")
        slices = sorted(job["slice_history"], key=lambda s: s["started_at"])
        for earlier, later in itertools.pairwise(slices):
            assert datetime.fromisoformat(earlier["ended_at"]) <= datetime.fromisoformat(later["started_at"])
    assert "exited" in stack.output() and "restarting" in stack.output()
