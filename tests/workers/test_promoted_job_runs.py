"""A promoted job gets service in its new tier while that tier is busy (issue 39 item 7), on real
GPU worker processes through a real broker, with the real promotion tick (the code beat runs,
called here between events instead of on beat's timer).

Under an endless stream of HP work, an SP job skipped for three rounds goes up to HP. There it is
ordered by its age among the HP jobs of its level, so the next GPU to come free takes it, ahead
of the HP jobs submitted after it; before the fix it was put behind every one of them, and the
stream kept it waiting for ever.
"""

from __future__ import annotations

import pytest

from clockq.jobs import promotion
from clockq.jobs.models import Job, JobEvent, Slice
from clockq.policy.ordering import BASE_LADDER_GPU_S
from clockq.policy.states import JobState
from clockq.policy.tiers import HP, SP
from tests.harness import wait_for
from tests.helpers import submit, wait_finished

pytestmark = pytest.mark.integration

GPUS = 2
HP_WORK = {"steps": 20, "step_ms": 50, "state_kb": 1}  # about a second on its GPU
QUEUED_HP = 2  # kept waiting at every moment: the stream never runs dry


def test_a_promoted_sp_job_runs_within_two_hp_run_times_under_an_endless_hp_stream(start_workers, alice, settings):
    # The default ladder: no job of the test passes a rung, so every job is on level 0 and only
    # tier, share and age order them (the case the fix is about).
    settings.CLOCKQ_SERVICE_LADDER_S = list(BASE_LADDER_GPU_S)
    start_workers(gpus=GPUS)
    stream: list[Job] = [submit(alice, HP.code, f"hp-{i}", **HP_WORK) for i in range(GPUS)]
    wait_for(lambda: Job.objects.filter(state=JobState.RUNNING).count() == GPUS, 30, what="both GPUs to run HP")
    starved = submit(alice, SP.code, "small-sp", steps=5, step_ms=20, state_kb=1)

    def keep_the_stream_going() -> None:
        queued = Job.objects.filter(tier__code=HP.code, original_tier__code=HP.code, state=JobState.QUEUED).count()
        for _ in range(QUEUED_HP - queued):
            stream.append(submit(alice, HP.code, f"hp-{len(stream)}", **HP_WORK))

    def promoted() -> JobEvent | None:
        return JobEvent.objects.filter(job=starved, reason__startswith=f"promoted {SP.code} -> {HP.code}").first()

    # Rounds: a promotion tick after each slice started while the SP job waits.
    promotion.promotion_tick()
    while promoted() is None:
        seen = Slice.objects.count()
        wait_for(lambda seen=seen: keep_the_stream_going() or Slice.objects.count() > seen, 30, what="a slice to start")
        promotion.promotion_tick()
    promotion_event = promoted()
    assert promotion_event is not None

    # The stream goes on; the SP job's first claim, or more HP jobs ended than two HP run times
    # on each GPU allow, whichever comes first.
    def hp_ended_since_promotion() -> int:
        return JobEvent.objects.filter(
            id__gt=promotion_event.id, to_state=JobState.SUCCEEDED, job__original_tier__code=HP.code
        ).count()

    def claimed() -> JobEvent | None:
        return JobEvent.objects.filter(
            job=starved, id__gt=promotion_event.id, reason__startswith="claimed on GPU"
        ).first()

    wait_for(
        lambda: keep_the_stream_going() or claimed() is not None or hp_ended_since_promotion() > 2 * GPUS,
        60,
        what="the promoted SP job to be claimed, or the HP stream to pass it by",
    )
    claim = claimed()
    assert claim is not None, f"{hp_ended_since_promotion()} HP jobs ended since the promotion, the SP job still waits"
    hp_before = JobEvent.objects.filter(
        id__gt=promotion_event.id, id__lt=claim.id, to_state=JobState.SUCCEEDED, job__original_tier__code=HP.code
    ).count()
    assert hp_before <= 2 * GPUS  # within two HP run times on each GPU
    # And it has its service there: no HP job that arrived after it takes its GPU back.
    (done,) = wait_finished(starved, timeout=60)
    assert done.state == JobState.SUCCEEDED
    assert not done.slices.filter(outcome="yielded").exists()
