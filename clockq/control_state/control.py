"""The control state: what the load forecast decided (admission, prefetch, desired workers), or
what an operator forced, with an audit row for every change.

The rules are pure (clockq/policy/control.py); this module applies them to the singleton
ControlState row under a row lock, and says which jobs held for admission that lets go: all of
them when it reopens, and at each forecast while it is closed those that `rules.admits` now lets
in (their room is no longer full). The controller (the forecast task) calls apply_forecast; the
admin calls force_state / unforce; submit_job reads admission() and weighs each job through a
Gate (clockq/jobs/admission.py).

The control state stands below the jobs, and imports nothing of them: the held jobs are released
by clockq/jobs/admission.py, which receives `release_held` (connected when the jobs app is ready).
"""

from __future__ import annotations

import enum
import logging
from datetime import datetime
from typing import Any, Protocol

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from clockq.control_state.models import ControlDecision, ControlState
from clockq.policy import control as rules
from clockq.policy.states import JobState

log = logging.getLogger("clockq.control")

CONTROLLER = "controller"


class Release(enum.Enum):
    """Which of the jobs held for admission a change of the control state lets go."""

    ALL = "all"  # admission is open: every one, the most urgent tier first, then the oldest
    WOULD_START = "would start"  # closed by the forecast: those that `rules.admits` lets in now


# Sent after a change is committed, with release (a Release), actor and why, and for WOULD_START
# gpus (the workers alive) and thresholds. Its receiver, clockq/jobs/admission.py, queues the jobs.
release_held = Signal()


def _release_held(release: Release, actor: str, why: str, gpus: int = 0, t: rules.Thresholds | None = None) -> None:
    release_held.send(ControlState, release=release, actor=actor, why=why, gpus=gpus, thresholds=t)


class HeldJob(Protocol):
    """What `held_release` reads of a job (clockq.jobs' Job)."""

    state: str
    held_for_admission: bool


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


def held_release(job: HeldJob, now: datetime | None = None) -> rules.ExpectedRelease | None:
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
    released (by tier, then age) after the state is committed (`release_held`).
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
        _release_held(Release.ALL, CONTROLLER, next(d.reason for d in changes if d.field == rules.ADMISSION))
    elif now_open:
        # Admission was open all along: a submission that read it closed just before it reopened
        # may have stored a held job after the release; pick up any such straggler.
        _release_held(Release.ALL, CONTROLLER, "admission open")
    else:
        _release_held(Release.WOULD_START, CONTROLLER, "it would start now", workers, t)
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
        _release_held(Release.ALL, actor, f"admission reopened by {actor}")
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
