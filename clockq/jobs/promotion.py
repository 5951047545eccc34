"""Starvation control applied: the promotion tick, batch chances and promotion by hand.

The rules are clockq/policy/promotion.py; this module gathers their facts from the database and
applies their decisions through compare-and-set transitions. A promoted job gets a new token and
a message on the higher tier's queue, so its old message goes stale; its worker returns it to
its own tier once it has had a fair amount of service there (workers/run/tiers.py).
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from clockq.bus import counters
from clockq.jobs.models import Job, PromotionClock, QueueTier, Slice
from clockq.jobs.services import ActionRefused
from clockq.jobs.transitions import transition
from clockq.policy import promotion as rules
from clockq.policy.states import JobState
from clockq.policy.tiers import TIER_CODES

log = logging.getLogger("clockq.promotion")

QUEUED = JobState.QUEUED
_CHUNK = 500  # ids per UPDATE: SQLite bounds the number of parameters


class PromotionRefused(ActionRefused):
    """A promotion by hand that cannot be done: the job is not waiting, or the tier is wrong."""


def promotion_tick(now: datetime | None = None) -> rules.TickDecisions:
    """One tick: judge the round since the previous tick, count skips, promote."""
    PromotionClock.objects.get_or_create(pk=1)
    with transaction.atomic():
        # Locked for the whole tick: two ticks at once would count one round twice.
        clock = PromotionClock.objects.select_for_update().get(pk=1)
        now = now or timezone.now()
        since, clock.last_tick_at = clock.last_tick_at, now
        if since is None or since >= now:
            clock.save(update_fields=["last_tick_at"])
            return rules.TickDecisions(is_round=False, skips={}, promotions=[])
        facts = _round_facts(since, now)
        tiers = {t.code: t for t in QueueTier.objects.all()}
        rule_of = {
            code: rules.TierRule(code, t.promote_after_rounds, tiers_code(tiers, t.promote_to_id))
            for code, t in tiers.items()
        }
        promotable = [c for c, r in rule_of.items() if r.promote_after_rounds and r.promote_to]
        waiting, tokens = _waiting(Job.objects.filter(state=QUEUED, original_tier__code__in=promotable))
        decisions = rules.decide_round(facts, waiting, rule_of)
        if decisions.is_round:
            clock.rounds += 1
            _count_skips(decisions.skips, since)
        clock.save(update_fields=["last_tick_at", "rounds"])
    # Each promotion is its own compare-and-set; one that lost a race to a claim changes nothing.
    promoted = _apply(decisions.promotions, tokens, tiers, actor="promotion tick")
    if promoted:
        log.info("promotion tick: promoted %s job(s)", promoted)
    return decisions


def give_batch_chance(tier_code: str, actor: str = "batch chance") -> int:
    """The tier's oldest waiting jobs get a chance in its chance tier. Returns how many."""
    tiers = {t.code: t for t in QueueTier.objects.all()}
    tier = tiers.get(tier_code)
    if tier is None:
        log.error("batch chance for unknown tier %r: check the periodic task's arguments", tier_code)
        return 0
    to = tiers_code(tiers, tier.chance_to_id)
    if not tier.chance_jobs or to is None:
        return 0
    oldest = Job.objects.filter(state=QUEUED, tier=tier, original_tier=tier).order_by("enqueued_at", "id")
    waiting, tokens = _waiting(oldest[: tier.chance_jobs])
    chosen = rules.batch_chance(waiting, tier=tier.code, jobs=tier.chance_jobs, to_tier=to)
    return _apply(chosen, tokens, tiers, actor=actor)


def promote_job(job: Job, actor: str, to_tier_code: str | None = None) -> Job:
    """Promotion by hand (staff): a more urgent tier until the job has had its fair amount of
    service there, then back, as a starved job."""
    tiers = {t.code: t for t in QueueTier.objects.all()}
    job.refresh_from_db()
    if job.state != QUEUED:
        raise PromotionRefused(f"only a waiting job can be promoted; job #{job.pk} is {job.state}")
    if job.tier_id != job.original_tier_id:
        raise PromotionRefused(f"job #{job.pk} is already promoted to {job.tier.code}")
    home = job.original_tier
    code = to_tier_code or tiers_code(tiers, home.promote_to_id)
    if code is None:
        more_urgent = [t for t in tiers.values() if t.rank < home.rank]
        code = max(more_urgent, key=lambda t: t.rank).code if more_urgent else None
    if code is None:
        raise PromotionRefused(f"{home.code} is the most urgent tier; there is nothing to promote job #{job.pk} to")
    if code not in TIER_CODES:
        raise PromotionRefused(f"unknown tier {code!r}; choose one of {', '.join(TIER_CODES)}")
    if tiers[code].rank >= home.rank:
        raise PromotionRefused(f"{code} is not more urgent than {home.code}")
    promotion = rules.Promotion(job.pk, home.code, code, f"promoted {home.code} -> {code} by hand")
    if not _apply([promotion], {job.pk: (job.dispatch_token, job.enqueued_at)}, tiers, actor=actor):
        job.refresh_from_db()
        raise PromotionRefused(f"job #{job.pk} changed meanwhile; it is {job.state}")
    job.refresh_from_db()
    return job


def tiers_code(tiers: dict[str, QueueTier], tier_id: int | None) -> str | None:
    return next((code for code, t in tiers.items() if t.pk == tier_id), None) if tier_id else None


def _round_facts(since: datetime, now: datetime) -> rules.RoundFacts:
    """Slices started in [since, now): finished ones are Slice rows; running ones are on the job."""
    ended = Slice.objects.filter(started_at__gte=since, started_at__lt=now)
    running = Job.objects.filter(state=JobState.RUNNING, slice_started_at__gte=since, slice_started_at__lt=now)
    jobs = set(ended.values_list("job_id", flat=True).distinct()) | set(running.values_list("id", flat=True))
    return rules.RoundFacts(started_at=since, slices_started=ended.count() + running.count(), jobs_that_started=jobs)


def _waiting(queryset) -> tuple[list[rules.WaitingJob], dict[int, tuple[str, datetime]]]:
    rows = queryset.values_list(
        "id", "tier__code", "original_tier__code", "skipped_rounds", "enqueued_at", "dispatch_token"
    )
    waiting, tokens = [], {}
    for job_id, tier, home, skipped, enqueued_at, token in rows:
        since = enqueued_at or timezone.now()
        waiting.append(rules.WaitingJob(job_id, tier, home, skipped, since))
        tokens[job_id] = (token, enqueued_at)
    return waiting, tokens


def _count_skips(skips: dict[int, int], round_start: datetime) -> None:
    """Every skip is +1. Only jobs still waiting since before the round: one claimed (and maybe
    requeued) meanwhile has started a new wait, and its streak must stay reset."""
    ids = list(skips)
    for i in range(0, len(ids), _CHUNK):
        Job.objects.filter(pk__in=ids[i : i + _CHUNK], state=QUEUED, enqueued_at__lte=round_start).update(
            skipped_rounds=F("skipped_rounds") + 1
        )


def _apply(
    promotions: list[rules.Promotion],
    tokens: dict[int, tuple[str, datetime]],
    tiers: dict[str, QueueTier],
    actor: str,
) -> int:
    done = 0
    for p in promotions:
        token, enqueued_at = tokens[p.job_id]
        to = tiers[p.to_tier]
        changed = transition(
            p.job_id,
            to=QUEUED,
            expect={QUEUED},
            token=token,
            rotate_token=True,
            reason=p.reason,
            actor=actor,
            # It keeps its wait: enqueued_at is when it entered the queue, not when it moved up.
            # Its service in the higher tier counts from here, and so does its level at a batch
            # chance (clockq/jobs/order.py, `Promotion.fresh_level`).
            updates={
                "tier": to,
                "skipped_rounds": 0,
                "enqueued_at": enqueued_at,
                "promoted_run_ms": F("run_ms"),
                "level_from_ms": F("run_ms") if p.fresh_level else 0,
            },
            queue_name=to.queue_name,
        )
        if changed is not None:
            counters.count_promotion(from_tier=p.from_tier, to_tier=p.to_tier, actor=actor)
        done += changed is not None
    return done
