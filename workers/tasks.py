"""Celery tasks. Each one is thin: it checks its arguments and calls into workers/."""

from __future__ import annotations

import logging
import re

import redis
from celery import shared_task
from celery.signals import worker_process_shutdown, worker_ready

from clockq.bus.dispatch import RUN_SLICE_TASK
from clockq.jobs import kpis, load_history, promotion, scale_hook, service_levels
from workers import heartbeat, reaper, reconcile, retention, runtime, shutdown
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


@shared_task(name="clockq.reconcile_queued_jobs", ignore_result=True)
def reconcile_queued_jobs() -> int:
    return reconcile.reconcile_queued_jobs()


@shared_task(name="clockq.reap_expired_leases", ignore_result=True)
def reap_expired_leases() -> int:
    return reaper.reap_expired_leases()


@shared_task(name="clockq.delete_old_checkpoints", ignore_result=True)
def delete_old_checkpoints() -> int:
    retention.delete_old_results()
    return retention.delete_old_checkpoints()


@shared_task(name="clockq.promotion_tick", ignore_result=True)
def promotion_tick() -> int:
    return len(promotion.promotion_tick().promotions)


@shared_task(name="clockq.batch_chance", ignore_result=True)
def batch_chance(tier="BP") -> int:
    if not isinstance(tier, str):
        log.error("batch chance: the periodic task's kwargs must name a tier code, got %r", tier)
        return 0
    return promotion.give_batch_chance(tier)


@shared_task(name="clockq.slo_check", ignore_result=True)
def slo_check() -> None:
    service_levels.check_service_levels()


@shared_task(name="clockq.kpi_rollup", ignore_result=True)
def kpi_rollup() -> int:
    return kpis.rollup()


@shared_task(name="clockq.load_sample", ignore_result=True)
def load_sample() -> float | None:
    try:
        sample = load_history.sample_load()
    except redis.RedisError as exc:
        log.warning("load sample: no sample this time, the broker did not answer (%s)", exc)
        return None
    return None if sample is None else sample.load_index


SCALE_OUT_MAX_RETRIES = 5


@shared_task(
    name=scale_hook.SCALE_OUT_TASK,
    bind=True,
    ignore_result=True,
    autoretry_for=(scale_hook.ScaleHookFailed,),
    max_retries=SCALE_OUT_MAX_RETRIES,
    retry_backoff=2,  # 2, 4, 8, 16, 32 s (with jitter: a random share of each)
    retry_backoff_max=300,
    retry_jitter=True,
)
def scale_out(self, desired, current=None, forecast=None, reason="") -> bool:
    if isinstance(desired, bool) or not isinstance(desired, int) or desired < 0:
        log.error("scale out: dropping a malformed request, desired=%r", desired)
        return False
    try:
        return scale_hook.scale_out(desired, current, forecast, str(reason))
    except scale_hook.ScaleHookFailed as exc:
        attempt, tries = self.request.retries + 1, SCALE_OUT_MAX_RETRIES + 1
        if attempt < tries:
            log.warning("scale out to %s: try %s of %s failed, retrying: %s", desired, attempt, tries, exc)
        else:
            log.error("scale out to %s: giving up after %s tries: %s", desired, tries, exc)
        raise


@worker_ready.connect
def _start_heartbeat(sender=None, **_kwargs) -> None:
    hostname = getattr(sender, "hostname", None) or "unknown"
    identity = runtime.WorkerIdentity.from_env(hostname)
    if identity.gpu_index < 0:  # the control worker
        heartbeat.start(hostname, None)
        return
    probe = make_probe(identity.gpu_index, identity.simulated, identity.memory_total_mib)
    heartbeat.start(hostname, identity.gpu_index, probe)


PERSIST_FLUSH_TIMEOUT_S = 120.0


@worker_process_shutdown.connect
def _flush_persists(**_kwargs) -> None:
    """A pool child exiting writes the checkpoints it snapshotted but has not written yet. (A
    task that sees the stop request flushes already; this covers a child stopped between tasks.)"""
    current = runtime.current()
    if current is not None and not current.persister.flush(timeout=PERSIST_FLUSH_TIMEOUT_S):
        unwritten = current.persister.in_flight()
        log.error("%s: exiting with %s checkpoint(s) not written", current.identity.hostname, unwritten)
