"""Compare-and-set state changes for jobs. Every change of a job's state goes through here."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from clockq.bus import counters
from clockq.bus.dispatch import publish_dispatch
from clockq.jobs import hot_sql
from clockq.jobs.models import Job, JobEvent, new_token
from clockq.policy.service_levels import finished_on_time
from clockq.policy.slicing import PendingAction
from clockq.policy.states import TERMINAL_STATES, JobState, can_transition
from clockq.policy.tiers import tier

log = logging.getLogger("clockq.transitions")
_EVERY_SWITCH = frozenset({(JobState.QUEUED, JobState.RUNNING), (JobState.RUNNING, JobState.QUEUED)})


@dataclass(frozen=True)
class Changed:
    """A transition that happened."""

    job_id: int
    from_state: str
    token: str  # the job's dispatch token after the change


def transition(
    job_id: int,
    *,
    to: JobState,
    expect: Iterable[JobState],
    reason: str,
    actor: str,
    token: str | None = None,
    rotate_token: bool = False,
    updates: dict[str, Any] | None = None,
    queue_name: str | None = None,
) -> Changed | None:
    """Move a job to `to` if it is in one of `expect` (and holds `token`, when given).

    Returns what changed, or None when the job was elsewhere: another process got there first,
    or the caller's token is stale. Nothing is written in that case. With `rotate_token`, the
    job gets a fresh dispatch token, so every message sent before this change becomes stale.
    Entering `queued` sends the wake-up message after commit, to `queue_name` if given (callers
    on the hot path know it), else to the job's tier queue.
    """
    expect = frozenset(expect)
    for src in expect:
        if not can_transition(src, to):
            raise ValueError(f"transition {src} -> {to} is not allowed")
    fields: dict[str, Any] = {"state": to, **(updates or {})}
    if rotate_token:
        fields["dispatch_token"] = new_token()
    # An operator's pending request is answered by any change of state.
    fields.setdefault("pending_action", PendingAction.NONE)
    if to != JobState.RUNNING:
        fields.setdefault("lease_expires_at", None)
    if to != JobState.HELD:
        # Only a job waiting for admission is held for it: once it leaves (released, cancelled,
        # timed out), an operator's later hold must not be mistaken for one.
        fields.setdefault("held_for_admission", False)
    if to != JobState.QUEUED:
        # Leaving the queue ends a wait; a starved job's streak of skipped rounds restarts.
        fields.setdefault("skipped_rounds", 0)
    if to not in (JobState.QUEUED, JobState.RUNNING):
        # A promoted job that leaves for any other state (held, cancelled, timed out, done) is
        # back in its own tier: a release or requeue must not carry the promotion along.
        fields.setdefault("tier_id", F("original_tier_id"))
        fields.setdefault("level_from_ms", 0)
    if to == JobState.QUEUED:
        now = timezone.now()
        fields.setdefault("enqueued_at", now)
        fields.setdefault("dispatched_at", now)
        fields.setdefault("worker", "")

    # No savepoint when nested in the caller's transaction (the slice runner records the slice in
    # the same one): a failed transition changes nothing, so there is nothing to roll back to.
    with transaction.atomic(savepoint=False):
        if len(expect) == 1 and token is not None:
            # The caller knows the state and token: one conditional UPDATE is the whole check.
            (state,) = expect
            current_token = token
        else:
            current = Job.objects.filter(pk=job_id).values_list("state", "dispatch_token").first()
            if current is None:
                return None
            state, current_token = current
            if state not in expect or (token is not None and current_token != token):
                return None
        # Hand-written statements (hot_sql): a slice switch runs this twice, the claim and the requeue.
        if hot_sql.update(Job, {"id": job_id, "state": state, "dispatch_token": current_token}, fields) != 1:
            return None  # another process got there first, or the token is stale
        hot_sql.insert(
            JobEvent, {"job_id": job_id, "from_state": state, "to_state": to, "reason": reason[:2000], "actor": actor}
        )
        changed = Changed(job_id, state, fields.get("dispatch_token", current_token))
        if to == JobState.QUEUED:
            queue = queue_name or tier(Job.objects.values_list("tier__code", flat=True).get(pk=job_id)).queue_name
            transaction.on_commit(lambda: publish_dispatch(job_id, changed.token, queue))
        if to in TERMINAL_STATES:
            _count_end(job_id, to)
    # Claims and requeues are every slice switch: their record is the job's history, not the log.
    level = logging.DEBUG if (state, to) in _EVERY_SWITCH else logging.INFO
    log.log(level, "job %s: %s -> %s (%s) by %s", job_id, state, to, reason, actor)
    return changed


def _count_end(job_id: int, state: JobState) -> None:
    """Count the end for /metrics (after commit), judged on time as the KPI rollup judges it.
    One read per job's end, inside the transition's transaction: it sees the columns just set."""
    fields = ("original_tier__code", "original_tier__wait_target_ms", "deadline", "first_wait_ms", "finished_at")
    tier, target_ms, deadline, first_wait_ms, finished_at = Job.objects.filter(pk=job_id).values_list(*fields).get()
    on_time = finished_on_time(
        succeeded=state == JobState.SUCCEEDED,
        finished_at=finished_at,
        deadline=deadline,
        first_wait_ms=first_wait_ms,
        target_ms=target_ms,
    )
    counters.count_job_end(tier=tier, state=state.value, on_time=on_time)
