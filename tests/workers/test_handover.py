"""Hand-over without the broker: a job that yields its GPU to a waiting job of its own tier, which
the order gives this GPU next, is followed there at once by that job, claimed through the
database; the waiting job's message is only the fallback that another worker may take first."""

from __future__ import annotations

import socket

import pytest

from clockq.bus import queues
from clockq.bus.client import client
from clockq.celery import app
from clockq.jobs.models import Job, JobEvent
from clockq.policy.tiers import TIER_BY_CODE
from tests.harness import wait_for
from tests.helpers import assert_no_overlap, claims, submit, wait_finished

pytestmark = pytest.mark.integration

SP_QUEUE = TIER_BY_CODE["SP"].queue_name


def _worker(gpu: int) -> str:
    return f"gpu{gpu}@{socket.gethostname()}"


def _stop_consuming(gpu: int) -> None:
    """The worker takes no more messages from the SP queue (Celery's own remote control)."""
    replies = app.control.cancel_consumer(SP_QUEUE, destination=[_worker(gpu)], reply=True, timeout=10)
    assert replies, f"{_worker(gpu)} did not answer"


def _consume_again(gpu: int) -> None:
    replies = app.control.add_consumer(SP_QUEUE, destination=[_worker(gpu)], reply=True, timeout=10)
    assert replies, f"{_worker(gpu)} did not answer"


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
    # Its message was withdrawn once the hand-over's claim won; the long job's requeue went out
    assert _messages_of(new) == []
    assert [job_id for job_id, _token in _messages_of(long)] == [long.pk]

    # And the long job, queued again, is woken by its own message once the worker takes them
    _consume_again(0)
    (long,) = wait_finished(long)
    assert long.state == "succeeded"


def test_a_hand_over_never_runs_a_job_twice_when_another_worker_races_for_its_message(start_workers, alice):
    # Given two GPUs: gpu0 runs a long-served SP job; gpu1 takes no SP messages for now, so
    # the new job's message waits in the broker
    start_workers(gpus=2)
    _stop_consuming(1)
    long = submit(alice, "SP", "long", steps=300, step_ms=5, state_kb=4)
    _served(long, slices=6)
    new = submit(alice, "SP", "new", steps=40, step_ms=5, state_kb=4)
    (message,) = _messages_of(new)

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
    assert message not in _messages_of(new)
