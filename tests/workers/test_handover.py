"""Hand-over without the broker: a job that yields its GPU to a waiting job of its own tier, which
the order gives this GPU next, is followed there at once by that job, claimed through the
database; the waiting job's message is only the fallback that another worker may take first."""

from __future__ import annotations

import socket

import pytest
from django.conf import settings

from clockq.bus import queues
from clockq.jobs.checkpoints import CheckpointStore
from clockq.jobs.models import Job, JobEvent
from clockq.policy.tiers import TIER_BY_CODE
from tests.harness import wait_for
from tests.helpers import assert_no_overlap, claims, set_consuming, submit, wait_finished

pytestmark = pytest.mark.integration

SP_QUEUE = TIER_BY_CODE["SP"].queue_name


def _worker(gpu: int) -> str:
    return f"gpu{gpu}@{socket.gethostname()}"


def _stop_consuming(gpu: int) -> None:
    """The worker takes no more messages from the SP queue."""
    set_consuming(_worker(gpu), SP_QUEUE, consume=False)


def _consume_again(gpu: int) -> None:
    set_consuming(_worker(gpu), SP_QUEUE, consume=True)


def _served(job: Job, slices: int) -> None:
    wait_for(lambda: Job.objects.get(pk=job.pk).slice_count >= slices, 30, what=f"job {job.pk} to run {slices} slices")


def _messages_of(job: Job) -> list[tuple[int, str]]:
    return [m for m in queues.queued_messages(SP_QUEUE) if m[0] == job.pk]


def test_a_job_of_its_own_tier_is_handed_over_without_a_broker_delivery(start_workers, alice):
    # Given a GPU running a long-served SP job, whose worker then stops taking SP messages
    start_workers(gpus=1)
    long = submit(alice, "SP", "long", steps=300, step_ms=5, state_kb=4)
    _served(long, slices=6)  # past several rungs of the tests' ladder (tests.helpers.SHORT_LADDER)
    _stop_consuming(0)

    # When a new SP job (level 0, so it comes first) waits with its message in the queue
    new = submit(alice, "SP", "new", steps=4, step_ms=5)

    # Then it runs to its end on that GPU, though no worker took its message from the broker
    wait_for(lambda: Job.objects.get(pk=new.pk).state == "succeeded", 30, what="the new job to finish")
    claim = JobEvent.objects.get(job=new, from_state="queued", to_state="running")
    assert claim.actor == _worker(0)
    yielded = JobEvent.objects.filter(job=long, from_state="running", to_state="queued", at__lte=claim.at)
    assert any(f"made way for job #{new.pk} " in e.reason for e in yielded)
    # Its message was withdrawn once the hand-over's claim won
    assert _messages_of(new) == []

    # And the long job, queued again and warm on this GPU, follows it there the same way
    (long,) = wait_finished(long)
    assert long.state == "succeeded"
    back = JobEvent.objects.filter(job=long, from_state="queued", to_state="running").order_by("at").last()
    assert back.actor == _worker(0)
    assert _messages_of(long) == []


def test_a_hand_over_never_runs_a_job_twice_when_another_worker_races_for_its_message(start_workers, alice):
    # Given two GPUs: gpu0 runs a long-served SP job; gpu1 takes no SP messages for now, so
    # the new job's message waits in the broker
    start_workers(gpus=2)
    _stop_consuming(1)
    long = submit(alice, "SP", "long", steps=300, step_ms=5, state_kb=4)
    _served(long, slices=6)
    new = submit(alice, "SP", "new", steps=40, step_ms=5, state_kb=4)

    # When gpu0 yields to it (and hands it over), gpu1 starts taking SP messages at that very
    # moment: the new job's message and gpu0's hand-over race for it
    wait_for(lambda: Job.objects.get(pk=long.pk).state != "running", 30, what="the long job to yield", interval=0.001)
    _consume_again(1)

    # Then the new job is claimed once and runs once, on one GPU
    long, new = wait_finished(long, new)
    assert new.state == long.state == "succeeded"
    assert claims(new) == 1
    assert new.slices.values("worker").distinct().count() == 1
    assert_no_overlap(new)
    assert _messages_of(new) == []  # taken, or withdrawn by the hand-over that won


def _yielded_warm_on_gpu0(alice, long_steps: int, next_steps: int) -> tuple[Job, Job]:
    """gpu0 runs a long-served SP job, then yields it to a new SP job and keeps it warm; gpu1
    takes no SP messages meanwhile. Returns (the yielded job, the new one), the yielded job's
    checkpoint written."""
    _stop_consuming(1)
    long = submit(alice, "SP", "long", steps=long_steps, step_ms=5, state_kb=64)
    # Past the 0.5 s rung of SP's ladder in tests: the new job runs a second before it passes it
    _served(long, slices=12)
    new = submit(alice, "SP", "new", steps=next_steps, step_ms=5)
    wait_for(lambda: Job.objects.get(pk=long.pk).state == "queued", 30, what="the long job to yield")
    long = Job.objects.get(pk=long.pk)
    assert long.worker == _worker(0)  # where it is warm
    store = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR)
    wait_for(lambda: store.path(long.pk, long.checkpoint_files[0]).exists(), 30, what="its checkpoint")
    return long, new


def test_a_preempted_job_goes_back_to_its_warm_gpu_when_that_frees_within_the_bound(start_workers, alice):
    # Given a job yielded on gpu0, warm there, whose checkpoint file is then damaged (a warm
    # resume does not read it; a cold restore would say so in the job's history)
    start_workers(gpus=2, CLOCKQ_WARM_WAIT_S="10")
    long, new = _yielded_warm_on_gpu0(alice, long_steps=300, next_steps=3000)
    path = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR).path(long.pk, long.checkpoint_files[0])
    path.write_bytes(path.read_bytes()[:-10])

    # When gpu1 is free and takes its message while gpu0 still runs the new job, and then an
    # operator holds the new job, which frees gpu0 (well within the bound of 10 s)
    _consume_again(1)
    wait_for(lambda: not _messages_of(long), 30, what="gpu1 to take the long job's message")
    assert Job.objects.get(pk=long.pk).state == "queued"
    Job.objects.filter(pk=new.pk).update(pending_action="hold")

    # Then gpu1 has left it to gpu0, which resumes it warm
    (long,) = wait_finished(long)
    assert long.state == "succeeded"
    back = JobEvent.objects.filter(job=long, from_state="queued", to_state="running").order_by("at").last()
    assert back.actor == _worker(0)
    assert back.at >= JobEvent.objects.get(job=new, to_state="held").at
    assert not long.events.filter(reason__contains="unusable").exists()


def test_a_preempted_job_goes_to_another_free_gpu_once_the_bound_passes(start_workers, alice):
    # Given a job yielded on gpu0, warm there, and gpu0 busy with a long job of its own tier
    start_workers(gpus=2, CLOCKQ_WARM_WAIT_S="0.1")
    long, new = _yielded_warm_on_gpu0(alice, long_steps=300, next_steps=3000)

    # When gpu1 is free and takes its message
    _consume_again(1)

    # Then after the bound it runs there, cold, while its warm GPU is still busy
    wait_for(lambda: Job.objects.get(pk=long.pk).state != "queued", 30, what="the long job to be claimed")
    claim = JobEvent.objects.filter(job=long, from_state="queued", to_state="running").order_by("at").last()
    assert claim.actor == _worker(1)
    assert Job.objects.get(pk=new.pk).state == "running"
    Job.objects.filter(pk=new.pk).update(pending_action="hold")  # no need to run it to its end
