"""The control plane's Celery tasks, on the `control` queue, which the control worker consumes.
Beat sends them (clockq/jobs/periodic.py, the one list of periodic tasks). Each one is thin:
it checks its arguments and calls into the core or control/."""

from __future__ import annotations

import logging

import redis
from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

from clockq.bus import heartbeat
from clockq.control_state import scale_hook
from clockq.forecasting import load_history
from clockq.jobs import promotion, queue_samples
from clockq.kpis import reports as kpis
from clockq.policy.tiers import BP
from control import reaper, reconcile, retention, service_levels

log = logging.getLogger("clockq.tasks")


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
def batch_chance(tier=BP.code) -> int:
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


@shared_task(name="clockq.queue_sample", ignore_result=True)
def queue_sample() -> int | None:
    try:
        sample = queue_samples.record_queue_sample()
    except redis.RedisError as exc:
        log.warning("queue sample: no sample this time, the broker did not answer (%s)", exc)
        return None
    return sum(sample.queued.values())


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
    if sender is not None and heartbeat.consumes(sender, settings.CONTROL_QUEUE):
        heartbeat.start(sender.hostname)
