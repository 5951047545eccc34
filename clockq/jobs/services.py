"""What users and operators do to jobs. Pages, the API, the admin and commands all call these."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone

from clockq.bus import signals
from clockq.bus.client import client
from clockq.bus.dispatch import publish_dispatches
from clockq.control_state import control
from clockq.jobs import admission, quotas, workloads
from clockq.jobs.models import Job, JobEvent, QueueTier
from clockq.jobs.transitions import Changed, transition
from clockq.policy.slicing import PendingAction
from clockq.policy.states import TERMINAL_STATES, JobState
from clockq.policy.tiers import tier as defined_tier

S = JobState
CANCEL_ATTEMPTS = 5


class ActionRefused(Exception):
    """The job is not in a state where this action makes sense."""


def submit_job(
    *,
    owner,
    name: str,
    tier_code: str,
    workload: str,
    params: dict,
    deadline=None,
    gpu_mem_mib: int | None = None,
    gpus: int = 1,
    actor: str | None = None,
) -> Job:
    """Create a queued job from already-validated input and send its wake-up message. Raises
    QuotaExceeded when the owner is at a limit.

    While admission is closed (clockq/control_state/control.py) a job that `admission.Gate` does
    not let in is accepted but stored `held`, marked held_for_admission, with no message: it is
    queued when a later forecast lets it in, or when admission reopens."""
    submission = {
        "name": name,
        "tier_code": tier_code,
        "workload": workload,
        "params": params,
        "deadline": deadline,
        "gpu_mem_mib": gpu_mem_mib,
        "gpus": gpus,
    }
    return submit_jobs(owner, [submission], actor)[0]


def submit_jobs(owner, submissions: list[dict], actor: str | None = None) -> list[Job]:
    """submit_job for several jobs at once, in one transaction: all are created or none. Each
    submission holds submit_job's keyword arguments (JobSubmitForm.submission()). The quota is
    checked for the batch as a whole (its job count and the sum of its declared state), so a
    batch cannot slip past a limit that each job alone would pass. Returns the jobs in order."""
    if not submissions:
        return []
    codes = {defined_tier(s["tier_code"]).code for s in submissions}  # UnknownTier: not a tier at all
    tiers = {t.code: t for t in QueueTier.objects.filter(code__in=codes)}
    if missing := sorted(codes - tiers.keys()):
        raise QueueTier.DoesNotExist(f"no row for tier {', '.join(missing)}: is the database migrated?")
    now = timezone.now()
    gate = admission.Gate(control.admission())
    who = actor or owner.get_username()
    declared = sum(workloads.declared_state_bytes(s["workload"], s["params"]) for s in submissions)
    jobs: list[Job] = []
    reasons: list[str] = []
    for sub in submissions:
        tier = tiers[sub["tier_code"]]
        admitted, held_why = gate.admits(tier.code, tier.rank)
        jobs.append(
            Job(
                owner=owner,
                name=sub["name"],
                tier=tier,
                original_tier=tier,
                workload=sub["workload"],
                params=sub["params"],
                gpu_mem_mib=sub.get("gpu_mem_mib"),
                gpus=sub.get("gpus") or 1,
                deadline=sub.get("deadline"),
                state=S.QUEUED if admitted else S.HELD,
                enqueued_at=now if admitted else None,
                dispatched_at=now if admitted else None,
                held_for_admission=not admitted,
            )
        )
        reason = f"submitted to {tier.code}"
        if not admitted:
            reason += f"; held: {held_why}"
        reasons.append(reason)
    # The jobs are built before the owner's lock is taken: the owner's other submits wait for
    # what is done under it.
    with transaction.atomic():
        # One submit at a time per owner, so two at once cannot both slip under a quota.
        get_user_model().objects.select_for_update().filter(pk=owner.pk).first()
        quotas.check_submit(owner, declared, count=len(submissions))
        if len(jobs) > 1 and connection.features.can_return_rows_from_bulk_insert:
            created = Job.objects.bulk_create(jobs)  # one INSERT; the ids come back
        else:
            for job in jobs:
                job.save(force_insert=True)
            created = jobs
        JobEvent.objects.bulk_create(
            JobEvent(job=job, from_state="", to_state=job.state, reason=reason, actor=who)
            for job, reason in zip(created, reasons, strict=True)
        )
        messages = [(job.pk, job.dispatch_token, job.tier.queue_name) for job in created if not job.held_for_admission]
        if messages:
            transaction.on_commit(lambda: publish_dispatches(messages))
        if any(job.held_for_admission for job in created):
            # Admission may have reopened between our read and this commit, its release sweep
            # running before these jobs existed: look again once they are committed.
            transaction.on_commit(admission.release_if_open)
    return created


def cancel_job(job: Job, actor: str) -> Job:
    """Cancel at once. A running worker notices at its next step and stops."""
    if job.state in TERMINAL_STATES:
        raise ActionRefused(f"job is already {job.state}")
    done = None
    # A worker may move the job between our read and our write (a slice boundary requeues it
    # with a new token): the compare-and-set then fails although the job is still active. Try
    # again from what it is now; only a job that has ended meanwhile refuses.
    for _attempt in range(CANCEL_ATTEMPTS):
        done = transition(
            job.pk,
            to=S.CANCELLED,
            expect={S.QUEUED, S.HELD, S.RUNNING},
            reason="cancelled",
            actor=actor,
            rotate_token=True,
            updates={"finished_at": timezone.now()},
        )
        if done is not None or Job.objects.filter(pk=job.pk, state__in=TERMINAL_STATES).exists():
            break
    if done and done.from_state == S.RUNNING:
        _tell_worker(job.pk)
    return _or_refuse(done, job, "cancel")


def hold_job(job: Job, actor: str) -> Job:
    """Keep a job from running. A running job checkpoints at its next step first."""
    if job.state == S.RUNNING:
        return _set_pending(job, PendingAction.HOLD, actor)
    done = transition(job.pk, to=S.HELD, expect={S.QUEUED}, reason="held", actor=actor, rotate_token=True)
    return _or_refuse(done, job, "hold")


def release_job(job: Job, actor: str) -> Job:
    done = transition(job.pk, to=S.QUEUED, expect={S.HELD}, reason="released", actor=actor, rotate_token=True)
    return _or_refuse(done, job, "release")


def requeue_job(job: Job, actor: str, why: str = "") -> Job:
    """Send a job back to its queue: a running one yields at its next boundary; one that
    failed, was cancelled or timed out resumes from its last checkpoint with a clean slate.
    `why` goes into the running job's history (a drain says which GPU and who)."""
    if job.state == S.RUNNING:
        return _set_pending(job, PendingAction.REQUEUE, actor, why)
    if job.state == S.HELD:
        return release_job(job, actor)
    done = transition(
        job.pk,
        to=S.QUEUED,
        expect={S.FAILED, S.CANCELLED, S.TIMED_OUT},
        reason="requeued",
        actor=actor,
        rotate_token=True,
        updates={"failures": 0, "finished_at": None},
    )
    return _or_refuse(done, job, "requeue")


def _set_pending(job: Job, action: PendingAction, actor: str, why: str = "") -> Job:
    updated = Job.objects.filter(pk=job.pk, state=S.RUNNING, pending_action=PendingAction.NONE).update(
        pending_action=action
    )
    if updated != 1:
        raise ActionRefused(f"cannot {action} job #{job.pk}: it is no longer running, or an action is pending")
    JobEvent.objects.create(
        job_id=job.pk,
        from_state=S.RUNNING,
        to_state=S.RUNNING,
        reason=f"{action} requested{f' ({why})' if why else ''}; takes effect at the next step"[:2000],
        actor=actor,
    )
    _tell_worker(job.pk)
    job.refresh_from_db()
    return job


def _tell_worker(job_id: int) -> None:
    """Ask the worker running this job to look at it at its next step, once this commits."""
    transaction.on_commit(lambda: signals.announce_job_changed(client(), job_id))


def _or_refuse(done: Changed | None, job: Job, action: str) -> Job:
    job.refresh_from_db()
    if done is None:
        raise ActionRefused(f"cannot {action} job #{job.pk} while it is {job.state}")
    return job
