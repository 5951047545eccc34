"""clockq's Celery app, for a GPU worker whose checkpoint writes a test can hold: while the file
named by CLOCKQ_TEST_PERSIST_GATE exists, each write first adds a line to `<gate>.held` and then waits
until the gate is gone. A test kills the worker while a write is held, so that a persist is in
flight at the kill for certain, instead of by luck of timing.

Started as `celery -A tests.workers.persist_gate_app worker ...` (tests/workers/test_persist_faults.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery.signals import worker_process_init

from clockq.celery import app

__all__ = ["app"]


@worker_process_init.connect
def _hold_writes_at_the_gate(**_kwargs) -> None:
    """In the pool child, where slices run and the persister writes."""
    from clockq.jobs.checkpoints import CheckpointStore

    gate = Path(os.environ["CLOCKQ_TEST_PERSIST_GATE"])
    write = CheckpointStore.write

    def gated_write(self, job_id, name, state):
        if gate.exists():
            with open(gate.with_name(gate.name + ".held"), "a") as held:  # a line per held write
                held.write(f"{job_id} {name}\n")
            while gate.exists():  # until the test opens it, or kills this process
                time.sleep(0.01)
        return write(self, job_id, name, state)

    CheckpointStore.write = gated_write
