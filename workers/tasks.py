"""The GPU worker's Celery tasks. Each one is thin: it checks its arguments and calls into workers/."""

from __future__ import annotations

import logging
import re

from celery import shared_task
from celery.signals import worker_process_shutdown, worker_ready

from clockq.bus import gpu_samples, heartbeat
from clockq.bus.client import client
from clockq.bus.dispatch import RUN_SLICE_TASK
from workers import drain, runtime, shutdown
from workers.probes import make_probe
from workers.slice_runner import RunOutcome, run_dispatch

log = logging.getLogger("clockq.tasks")
_TOKEN = re.compile(r"^[0-9a-f]{32}$")


@shared_task(name=RUN_SLICE_TASK, bind=True, acks_late=True, ignore_result=True)
def run_slice(self, job_id, token) -> RunOutcome:
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not isinstance(token, str) or not _TOKEN.match(token):
        log.error("dropping malformed dispatch message: job_id=%r token=%r", job_id, token)
        return RunOutcome.MALFORMED
    shutdown.ensure_handler()
    return run_dispatch(job_id, token, runtime.for_worker(self.request.hostname or "unknown"))


@worker_ready.connect
def _start_heartbeat(sender=None, **_kwargs) -> None:
    hostname = getattr(sender, "hostname", None) or "unknown"
    identity = runtime.WorkerIdentity.from_env(hostname)
    if identity.gpu_index < 0:  # not a GPU worker: its own role announces it
        return
    drain.apply_at_start(sender)  # before the event loop takes its first message
    watch = drain.DrainWatch(sender)
    probe = make_probe(identity.gpu_index, identity.simulated, identity.memory_total_mib)

    def on_beat() -> None:
        # The pool process publishes while a slice runs; the parent fills in while idle.
        gpu_samples.publish(client(), probe.sample(), only_if_absent=True)
        watch.check()

    heartbeat.start(hostname, identity.gpu_index, on_beat, status=watch.status)


PERSIST_FLUSH_TIMEOUT_S = 120.0


@worker_process_shutdown.connect
def _flush_persists(**_kwargs) -> None:
    """A pool child exiting writes the checkpoints it snapshotted but has not written yet. (A
    task that sees the stop request flushes already; this covers a child stopped between tasks.)"""
    current = runtime.current()
    if current is not None and not current.persister.flush(timeout=PERSIST_FLUSH_TIMEOUT_S):
        unwritten = current.persister.in_flight()
        log.error("%s: exiting with %s checkpoint(s) not written", current.identity.hostname, unwritten)
