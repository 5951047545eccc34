"""Admission, as it touches jobs: how a submission is weighed against a closed admission (`Gate`),
and the release of the jobs held for it.

The control state (clockq/control_state/control.py) stands below the jobs and never imports
them: when a forecast or an operator changes it, it sends `control.release_held` saying which
held jobs that lets go (all of them, admission being open, or those that would start now), and
`on_release_held` here, connected when the jobs app is ready (clockq/jobs/apps.py), queues them.
A submission (clockq/jobs/services.py) reads the control state through a Gate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db.models import QuerySet

from clockq.control_state import control
from clockq.control_state.models import ControlState
from clockq.jobs import order
from clockq.jobs.models import Job
from clockq.jobs.tier_rank import tier_rank
from clockq.jobs.transitions import transition
from clockq.policy import control as rules
from clockq.policy.states import JobState
from clockq.policy.tiers import tier

log = logging.getLogger("clockq.control")

RELEASE_BATCH = 200


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
        self.hold = control.thresholds().hold
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
        why = control.closed_note(self.state) + (f"; {rules.held_note(room)}" if room is not None else "")
        return False, f"{why}; {control.release_note(self.state)}"


def release_held_for_admission(actor: str, why: str) -> int:
    """Queue the jobs held because admission was closed: the most urgent tier first, then the
    oldest, each through the release transition (a compare-and-set on its state and token, that
    sends its wake-up message). Jobs an operator held are not touched. Stops if admission closes
    again meanwhile. Safe to run twice at once: each job is released once. Returns how many."""
    return _release(Job.objects.all(), actor, why, keep_going=control.admission_open)


def release_held_that_would_start(gpus: int, t: rules.Thresholds) -> int:
    """While the forecast keeps admission closed: queue the held jobs that `rules.admits` now
    lets in, asked as new jobs of their tier would be (the most urgent tier first; a tier's
    jobs are alike to the rule, and go oldest first). Returns how many."""
    released = 0
    cluster_now: rules.Cluster | None = None
    held_tiers = sorted(
        (tier(code).rank, code, tier_id)
        for code, tier_id in Job.objects.filter(state=JobState.HELD, held_for_admission=True)
        .order_by()
        .values_list("tier__code", "tier_id")
        .distinct()
    )
    for rank, code, tier_id in held_tiers:
        if not rules.weighs_room(code, False, hold=t.hold):
            continue  # the room does not matter: held until admission reopens
        cluster_now = cluster_now or cluster(gpus)
        room = cluster_now.room(rank)
        if not rules.admits(code, False, hold=t.hold, room=room):
            continue
        why = "it would start now: " + ("a GPU is free" if room.free_gpus else "the cluster is no longer full for it")
        done = _release(Job.objects.filter(tier_id=tier_id), control.CONTROLLER, why, keep_going=_closed_by_forecast)
        cluster_now = cluster_now.with_queued(rank, done)
        released += done
    return released


def _closed_by_forecast() -> bool:
    state = control.admission()
    return not state.admission_open and not state.forced


def _release(jobs: QuerySet[Job], actor: str, why: str, *, keep_going: Callable[[], bool]) -> int:
    """Release the jobs held for admission among `jobs`, oldest first, while keep_going()."""
    released = 0
    while keep_going():
        before = released
        batch = list(
            jobs.filter(state=JobState.HELD, held_for_admission=True)
            .order_by(tier_rank("tier__code"), "submitted_at", "id")
            .values_list("id", "dispatch_token", "tier__code")[:RELEASE_BATCH]
        )
        if not batch:
            break
        for job_id, token, code in batch:
            done = transition(
                job_id,
                to=JobState.QUEUED,
                expect={JobState.HELD},
                token=token,
                reason=f"released: {why}",
                actor=actor,
                rotate_token=True,
                queue_name=tier(code).queue_name,
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
    if control.admission_open():
        release_held_for_admission(control.CONTROLLER, "admission reopened while it was being submitted")


def on_release_held(
    sender=None,
    *,
    release: control.Release,
    actor: str,
    why: str,
    gpus: int = 0,
    thresholds: rules.Thresholds | None = None,
    **_kwargs,
) -> int:
    """The receiver of `control.release_held`: queue what the control state's change lets go."""
    if release is control.Release.ALL:
        return release_held_for_admission(actor, why)
    return release_held_that_would_start(gpus, thresholds or control.thresholds())
