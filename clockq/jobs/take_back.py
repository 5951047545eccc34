"""Take back a running job whose worker is gone, to run it again from its last good checkpoint.

One rule for every way a worker is known to be gone: the reaper's (its lease expired,
control/reaper.py) and a GPU's main worker's when its RT lane died (the lane's lock came free,
workers/lane_life.py). The job goes back to its queue with a new dispatch token, through a
compare-and-set on the state and token it was seen with; the lost slice is recorded as `lost`,
and the slices recorded after that checkpoint was taken (without one of their own) as rolled
back: the job runs their steps again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import QuerySet

from clockq.bus import counters, lanes
from clockq.jobs.checkpoints import generation_label
from clockq.jobs.models import Job, Slice
from clockq.jobs.transitions import transition
from clockq.policy.slicing import SliceOutcome
from clockq.policy.states import JobState


@dataclass(frozen=True)
class LostRun:
    """A running job as it was seen on a worker that is gone: what its take-back needs."""

    job_id: int
    token: str
    worker: str
    slice_started_at: datetime | None
    checkpoint_files: list[str]
    lease_expires_at: datetime | None
    tier: str

    FIELDS = (
        "id",
        "dispatch_token",
        "worker",
        "slice_started_at",
        "checkpoint_files",
        "lease_expires_at",
        "original_tier__code",
    )

    @classmethod
    def of(cls, jobs: QuerySet[Job]) -> list[LostRun]:
        """The running jobs among `jobs`, one read."""
        return [cls(*row) for row in jobs.filter(state=JobState.RUNNING).values_list(*cls.FIELDS)]


def take_back(run: LostRun, *, lost_at: datetime, why: str, actor: str) -> bool:
    """Queue `run`'s job again from the checkpoint generation the database names, `why` (its
    worker is gone, said for people) recorded on the event. False when the job is no longer as
    `run` saw it (its worker renewed, finished, or another actor took it back first): then
    nothing is written. The caller must know the worker is gone: the new token makes anything it
    would still send stale, but cannot stop it running the job beside its next claim."""
    # What the job resumes from, as its history says: the generation the database names.
    generation = generation_label(run.checkpoint_files[0]) if run.checkpoint_files else 0
    with transaction.atomic():
        changed = transition(
            run.job_id,
            to=JobState.QUEUED,
            expect={JobState.RUNNING},
            token=run.token,
            rotate_token=True,
            reason=f"{why}; running again from checkpoint generation {generation}",
            actor=actor,
        )
        if changed is None:
            return False
        Slice.objects.create(
            job_id=run.job_id,
            worker=run.worker or "unknown",
            gpu_index=gpu_of(run.worker),
            started_at=run.slice_started_at or lost_at,
            ended_at=lost_at,
            planned_ms=0,
            used_ms=0,
            outcome=SliceOutcome.LOST,
        )
        if isinstance(generation, int):
            Slice.objects.roll_back_to(run.job_id, generation)
        counters.count_slice(tier=run.tier, outcome=SliceOutcome.LOST, used_ms=0)
    return True


def gpu_of(worker: str) -> int:
    """gpu<N>@host (or its RT lane, rt<N>@host) -> N, or -1 when the name says nothing."""
    name = (lanes.main_of(worker) or worker).split("@", 1)[0]
    return int(name[3:]) if name.startswith("gpu") and name[3:].isdigit() else -1
