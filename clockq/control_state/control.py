"""The control state: what the load forecast decided (admission, prefetch, desired workers), or
what an operator forced, with an audit row for every change.

The rules are pure (clockq/policy/control.py); this module applies them to the singleton
ControlState row under a row lock, and releases the jobs held for admission: all of them when it
reopens, and at each forecast while it is closed those that `rules.admits` now lets in (their
room is no longer full). The controller (the forecast task) calls apply_forecast; the admin calls
force_state / unforce; submit_job reads admission() and weighs each job through a Gate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from clockq.control_state.models import ControlDecision, ControlState
from clockq.jobs import order
from clockq.jobs.models import Job
from clockq.jobs.transitions import transition
from clockq.policy import control as rules
from clockq.policy.states import JobState

log = logging.getLogger("clockq.control")

CONTROLLER = "controller"
RELEASE_BATCH = 200


class ControlRefused(ValueError):
    """A forced state that makes no sense; the message says why. Nothing was changed."""


def thresholds() -> rules.Thresholds:
    t = rules.Thresholds(
        close_above=settings.CLOCKQ_ADMISSION_CLOSE_ABOVE,
        reopen_below=settings.CLOCKQ_ADMISSION_REOPEN_BELOW,
        max_workers=settings.CLOCKQ_MAX_GPU_WORKERS,
        hold=settings.CLOCKQ_ADMISSION_HOLDS,
        warmup_samples=settings.CLOCKQ_ADMISSION_WARMUP_SAMPLES,
    )
    if problems := rules.threshold_problems(t):
        raise ImproperlyConfigured("CLOCKQ_ADMISSION_*: " + " ".join(p.message for p in problems))
    return t


def control_state() -> ControlState:
    """The singleton row, created with its defaults (admission open) the first time."""
    state = ControlState.objects.filter(pk=ControlState.SINGLETON).first()
    if state is None:
        state, _ = ControlState.objects.get_or_create(pk=ControlState.SINGLETON)
    return state


def admission() -> ControlState:
    """The state as a submission sees it: one read, no write. Before any forecast or override
    there is no row, and admission is open."""
    return ControlState.objects.filter(pk=ControlState.SINGLETON).first() or ControlState()


def admission_open() -> bool:
    return admission().admission_open


def closed_note(state: ControlState) -> str:
    """Why admission is closed, e.g. 'admission closed (forecast 91% > 85%)'."""
    return rules.closed_note(state.forced_by if state.forced else None, state.forecast, thresholds())


def release_note(state: ControlState) -> str:
    """When a job held for admission is queued, e.g. 'it is queued when admission reopens'."""
    return rules.release_note(forced=state.forced, hold=thresholds().hold)


def held_release(job: Job, now: datetime | None = None) -> rules.ExpectedRelease | None:
    """When a job held for admission is expected to be queued (`rules.expected_release`), for its
    page; None for any other job (an operator's hold, or not held)."""
    if job.state != JobState.HELD or not job.held_for_admission:
        return None
    state = admission()
    return rules.expected_release(
        admission_open=state.admission_open,
        forced_by=(state.forced_by or "") if state.forced else None,
        forecast=state.forecast,
        forecast_at=state.forecast_at,
        every_s=settings.CLOCKQ_FORECAST_EVERY_S,
        now=now or timezone.now(),
        t=thresholds(),
    )


def holding_note(state: ControlState) -> str:
    """What a closed admission does to new jobs, for the submit form."""
    return rules.holding_note(forced=state.forced, hold=thresholds().hold)


def cluster(gpus: int) -> rules.Cluster:
    """The cluster as a closed admission weighs it now: `gpus` GPUs (the workers alive at the
    latest forecast), those that no running job holds, and, only while none is free (the
    queue matters only then: `Room.full`), the queued jobs by class."""
    free = max(0, gpus - Job.objects.filter(state=JobState.RUNNING).count())
    return rules.Cluster(gpus, free, tuple(order.queued_by_class()) if gpus and not free else ())


class Gate:
    """Admission as one submission weighs its jobs: one read of the control state, and of the
    cluster only if the rule weighs it (admission closed by the forecast, a tier it may hold)."""

    def __init__(self, state: ControlState):
        self.state = state
        self.hold = thresholds().hold
        self._cluster: rules.Cluster | None = None

    def admits(self, tier_code: str, rank: int) -> tuple[bool, str]:
        """Whether a new job of this tier is queued now, and if not, why it is held."""
        is_open, forced = self.state.admission_open, self.state.forced
        room = None
        if rules.weighs_room(tier_code, is_open, forced=forced, hold=self.hold):
            if self._cluster is None:
                self._cluster = cluster(self.state.gpus or 0)
            room = self._cluster.room(rank)
        if rules.admits(tier_code, is_open, forced=forced, hold=self.hold, room=room):
            if room is not None and self._cluster is not None:
                self._cluster = self._cluster.with_queued(rank)  # ahead of the batch's lower tiers
            return True, ""
        why = closed_note(self.state) + (f"; {rules.held_note(room)}" if room is not None else "")
        return False, f"{why}; {release_note(self.state)}"


def apply_forecast(
    forecast: float, at: datetime | None = None, workers: int = 0, basis: rules.Basis | None = None
) -> list[rules.Decision]:
    """Run the control rules on a forecast and write what changed, with an audit row per change.
    Returns the changes (empty when nothing changed). `basis`: the model behind the forecast and
    the load samples kept (admission leaves persistence alone during its warm-up); None, a
    forecast acted on as it is.

    `workers` is the number of GPU workers alive now. While an operator's override is in force
    only the forecast is recorded. A forecast older than the one recorded is ignored, so a late
    message cannot undo a newer decision. When admission reopens, the jobs held for it are
    released (by tier, then age) after the state is committed.
    """
    if problem := rules.forecast_problem(forecast):
        raise ValueError(problem)
    at = at or timezone.now()
    t = thresholds()
    with transaction.atomic():
        state = _locked()
        if state.forecast_at is not None and at < state.forecast_at:
            log.info("forecast of %s ignored: older than the one recorded (%s)", at, state.forecast_at)
            return []
        if state.forced:
            ControlState.objects.filter(pk=state.pk).update(forecast=forecast, forecast_at=at)
            return []
        current = rules.Current(state.admission_open, state.prefetch_on, state.desired_workers)
        decisions = rules.decide(forecast, current, workers, t, basis)
        changes = [d for d in decisions if d.changed]
        ControlState.objects.filter(pk=state.pk).update(
            **{d.field: d.new for d in decisions},
            reason="; ".join(d.reason for d in decisions),
            forecast=forecast,
            forecast_at=at,
            gpus=workers,
            updated_at=timezone.now(),
        )
        _audit(changes, forecast, CONTROLLER)
    for change in changes:
        log.info("control: %s (forecast %.3f)", change.reason, forecast)
    now_open = next(bool(d.new) for d in decisions if d.field == rules.ADMISSION)
    if not state.admission_open and now_open:
        release_held_for_admission(CONTROLLER, next(d.reason for d in changes if d.field == rules.ADMISSION))
    elif now_open:
        # Admission was open all along: a submission that read it closed just before it reopened
        # may have stored a held job after the release; pick up any such straggler.
        release_held_for_admission(CONTROLLER, "admission open")
    else:
        release_held_that_would_start(workers, t)
    return changes


def force_state(
    *,
    actor: str,
    admission_open: bool | None = None,
    prefetch_on: bool | None = None,
    desired_workers: int | None = None,
    note: str = "",
) -> list[rules.Decision]:
    """An operator sets the state by hand (None: keep that value). The override holds until
    unforce(): the controller records forecasts but changes nothing. Returns the changes."""
    if desired_workers is not None and (
        isinstance(desired_workers, bool) or not isinstance(desired_workers, int) or desired_workers < 0
    ):
        raise ControlRefused(f"desired workers must be a whole number of 0 or more, not {desired_workers!r}")
    if desired_workers is not None and desired_workers > settings.CLOCKQ_MAX_GPU_WORKERS:
        raise ControlRefused(
            f"desired workers: at most {settings.CLOCKQ_MAX_GPU_WORKERS} (CLOCKQ_MAX_GPU_WORKERS), "
            f"not {desired_workers}"
        )
    wanted: dict[str, Any] = {
        rules.ADMISSION: admission_open,
        rules.PREFETCH: prefetch_on,
        rules.WORKERS: desired_workers,
    }
    reason = f"forced by {actor}" + (f": {note.strip()}" if note.strip() else "")
    with transaction.atomic():
        state = _locked()
        changes = [
            rules.Decision(field, getattr(state, field), new, reason)
            for field, new in wanted.items()
            if new is not None and getattr(state, field) != new
        ]
        if not state.forced:
            changes.insert(0, rules.Decision("forced", False, True, reason))
        ControlState.objects.filter(pk=state.pk).update(
            **{d.field: d.new for d in changes if d.field in wanted},
            forced=True,
            forced_by=actor,
            reason=reason,
            updated_at=timezone.now(),
        )
        _audit(changes, state.forecast, actor)
    if not state.admission_open and admission_open:
        release_held_for_admission(actor, f"admission reopened by {actor}")
    return changes


def unforce(actor: str) -> list[rules.Decision]:
    """End an operator's override. The values stay as they are until the next forecast, which
    judges them by the usual rules (a closed admission reopens only below the reopen threshold)."""
    with transaction.atomic():
        state = _locked()
        if not state.forced:
            return []
        reason = f"override cleared by {actor}; the controller decides from the next forecast"
        ControlState.objects.filter(pk=state.pk).update(
            forced=False, forced_by="", reason=reason, updated_at=timezone.now()
        )
        changes = [rules.Decision("forced", True, False, reason)]
        _audit(changes, state.forecast, actor)
    return changes


def release_held_for_admission(actor: str, why: str) -> int:
    """Queue the jobs held because admission was closed: the most urgent tier first, then the
    oldest, each through the release transition (a compare-and-set on its state and token, that
    sends its wake-up message). Jobs an operator held are not touched. Stops if admission closes
    again meanwhile. Safe to run twice at once: each job is released once. Returns how many."""
    return _release(Job.objects.all(), actor, why, keep_going=admission_open)


def release_held_that_would_start(gpus: int, t: rules.Thresholds) -> int:
    """While the forecast keeps admission closed: queue the held jobs that `rules.admits` now
    lets in, asked as new jobs of their tier would be (the most urgent tier first; a tier's
    jobs are alike to the rule, and go oldest first). Returns how many."""
    released = 0
    cluster_now: rules.Cluster | None = None
    held_tiers = (
        Job.objects.filter(state=JobState.HELD, held_for_admission=True)
        .order_by("tier__rank")
        .values_list("tier__code", "tier__rank", "tier_id")
        .distinct()
    )
    for code, rank, tier_id in held_tiers:
        if not rules.weighs_room(code, False, hold=t.hold):
            continue  # the room does not matter: held until admission reopens
        cluster_now = cluster_now or cluster(gpus)
        room = cluster_now.room(rank)
        if not rules.admits(code, False, hold=t.hold, room=room):
            continue
        why = "it would start now: " + ("a GPU is free" if room.free_gpus else "the cluster is no longer full for it")
        done = _release(Job.objects.filter(tier_id=tier_id), CONTROLLER, why, keep_going=_closed_by_forecast)
        cluster_now = cluster_now.with_queued(rank, done)
        released += done
    return released


def _closed_by_forecast() -> bool:
    state = admission()
    return not state.admission_open and not state.forced


def _release(jobs: QuerySet[Job], actor: str, why: str, *, keep_going: Callable[[], bool]) -> int:
    """Release the jobs held for admission among `jobs`, oldest first, while keep_going()."""
    released = 0
    while keep_going():
        before = released
        batch = list(
            jobs.filter(state=JobState.HELD, held_for_admission=True)
            .order_by("tier__rank", "submitted_at", "id")
            .values_list("id", "dispatch_token", "tier__queue_name")[:RELEASE_BATCH]
        )
        if not batch:
            break
        for job_id, token, queue in batch:
            done = transition(
                job_id,
                to=JobState.QUEUED,
                expect={JobState.HELD},
                token=token,
                reason=f"released: {why}",
                actor=actor,
                rotate_token=True,
                queue_name=queue,
            )
            released += done is not None
        if len(batch) < RELEASE_BATCH or released == before:
            break  # the last batch, or one that lost every race: never spin on the same jobs
    if released:
        log.info("released %s job(s) held for admission (%s)", released, why)
    return released


def release_if_open() -> None:
    """Called once a held-for-admission submission has committed: if admission reopened between
    the submission's read and its commit, the release sweep may have run before the job existed,
    so release it now."""
    if admission_open():
        release_held_for_admission(CONTROLLER, "admission reopened while it was being submitted")


def _locked() -> ControlState:
    """The singleton, locked for the rest of the transaction (SQLite: its IMMEDIATE transactions
    already serialise writers)."""
    control_state()
    return ControlState.objects.select_for_update().get(pk=ControlState.SINGLETON)


def _audit(changes: list[rules.Decision], forecast: float | None, actor: str) -> None:
    ControlDecision.objects.bulk_create(
        ControlDecision(
            what=d.field, old=_text(d.old), new=_text(d.new), reason=d.reason[:2000], forecast=forecast, actor=actor
        )
        for d in changes
    )


def _text(value: object) -> str:
    return "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
