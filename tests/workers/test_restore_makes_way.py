"""An RT job does not wait for a cold restore: a worker that is still waiting for another
worker's persist of the job it claimed gives the GPU up at once, if the order names it to make
way, and the job goes back to its queue as it was."""

from __future__ import annotations

import pytest
from django.test import override_settings

from clockq.bus import persists, signals
from clockq.bus.client import client
from clockq.jobs import order
from clockq.jobs.checkpoints import CheckpointStore, checkpoint_name
from clockq.jobs.models import Job
from tests.harness import program_python
from tests.helpers import after_the_claim, not_free, submit
from workers.run.restore import Restore
from workers.runtime import Runtime, WorkerIdentity
from workers.slice_runner import RunOutcome, run_dispatch
from workers.workloads import command
from workers.workloads.synthetic import SyntheticWorkload

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def one_job_per_dispatch(monkeypatch):
    """These tests call run_dispatch for one job and look at what it did: no hand-over to the
    rival it yields to, and no warm job taken after it (tests/workers/test_handover.py has those)."""
    monkeypatch.setattr("workers.slice_runner._hand_over", lambda *_args: None)


MADE_WAY = "made way for job #"  # the RT job, "(RT, service level 0) during its restore (...)"
DURING_RESTORE = "(RT, service level 0) during its restore"


def _checkpointed_elsewhere(alice) -> tuple[Job, str]:
    """A queued SP job whose newest checkpoint (generation 2) the database names but another
    worker, gpu9@elsewhere, is still writing; generation 1 is on disk."""
    job = submit(alice, "SP", "big", steps=400, step_ms=1, state_kb=64)
    rival = submit(alice, "SP", "rival", steps=1)  # waits, so `job` yields at its first boundary
    there = Runtime(WorkerIdentity("gpu1@test", 1))
    with override_settings(CLOCKQ_OVERHEAD_BUDGET=0):
        assert run_dispatch(job.pk, job.dispatch_token, there) == RunOutcome.YIELDED
    assert there.persister.flush(timeout=30)  # generation 1 is written in the background
    not_free(there)
    Job.objects.filter(pk=rival.pk).update(state="cancelled")
    job = Job.objects.get(pk=job.pk)
    (first,) = job.checkpoint_files
    in_flight = checkpoint_name(2, job.dispatch_token)
    persists.mark(client(), job.pk, in_flight, "gpu9@elsewhere")
    Job.objects.filter(pk=job.pk).update(checkpoint_files=[in_flight, first], checkpoint_generation=2)
    return Job.objects.get(pk=job.pk), first


def rt_job_arrives(owner, runtime: Runtime | None = None) -> Job:
    """Submit an RT job now and, with `runtime`, signal its worker at once. Submitted before
    the claim, the RT job would be claimed instead (it comes first in the order): these tests
    have it arrive once the worker holds its job."""
    rt = submit(owner, "RT", "urgent", steps=1)
    if runtime is not None:
        runtime.threads.interrupts.heard_urgent(0)
    return rt


def when_asked_for_the_writer_of(name: str, then, monkeypatch) -> None:
    """Call `then()` once a worker asks who writes checkpoint `name`: it waits for that persist."""
    writer_of = persists.writer_of

    def asked(r, job_id, asked_name):
        if asked_name == name:
            then()
        return writer_of(r, job_id, asked_name)

    monkeypatch.setattr(persists, "writer_of", asked)


def test_a_restore_waiting_for_a_persist_makes_way_for_an_rt_job(alice, monkeypatch):
    job, _first = _checkpointed_elsewhere(alice)
    here = Runtime(WorkerIdentity("gpu0@test", 0))
    assert signals.wait_until_listening(5)
    # The RT job arrives (its message in the RT queue, announced) once the worker waits for generation 2.
    in_flight = job.checkpoint_files[0]
    arrived: list[bool] = []

    def arrives_once():  # the worker asks for the writer more than once while it waits
        if not arrived:
            arrived.append(True)
            rt_job_arrives(alice, here)

    when_asked_for_the_writer_of(in_flight, arrives_once, monkeypatch)
    persists.mark(client(), job.pk, in_flight, "gpu9@elsewhere")  # a fresh 6 s

    outcome = run_dispatch(job.pk, job.dispatch_token, here)

    # At once: while the writer's mark still holds, and before the restore and a step.
    assert outcome == RunOutcome.YIELDED
    assert persists.writer_of(client(), job.pk, in_flight) == "gpu9@elsewhere"
    after = Job.objects.get(pk=job.pk)
    assert after.state == "queued" and after.dispatch_token != job.dispatch_token
    assert after.checkpoint_files == job.checkpoint_files and after.checkpoint_generation == 2
    assert after.progress == job.progress
    assert (
        after.events.filter(reason__startswith=MADE_WAY, reason__contains=DURING_RESTORE)
        .filter(reason__contains="gpu9@elsewhere was still writing")
        .exists()
    )
    made_way = after.slices.order_by("-id").first()
    assert (made_way.outcome, made_way.steps, made_way.preempted) == ("yielded", 0, True)


def test_a_claim_signalled_before_its_restore_makes_way_before_its_setup(alice, monkeypatch):
    job, _first = _checkpointed_elsewhere(alice)
    here = Runtime(WorkerIdentity("gpu0@test", 0))
    monkeypatch.setattr(SyntheticWorkload, "setup", lambda *_: pytest.fail("set up for nothing"))

    with after_the_claim(lambda: rt_job_arrives(alice, here)):
        assert run_dispatch(job.pk, job.dispatch_token, here) == RunOutcome.YIELDED
    assert Job.objects.get(pk=job.pk).events.filter(reason__endswith=f"{DURING_RESTORE} (before its setup)").exists()


def test_an_rt_job_signalled_during_the_setup_is_served_before_the_read(alice, monkeypatch):
    job, _first = _checkpointed_elsewhere(alice)
    here = Runtime(WorkerIdentity("gpu0@test", 0))
    assert signals.wait_until_listening(5)
    setup = SyntheticWorkload.setup

    def slow_setup(workload, ctx):  # a model build, during which the RT job is announced
        setup(workload, ctx)
        rt_job_arrives(alice, here)

    monkeypatch.setattr(SyntheticWorkload, "setup", slow_setup)
    monkeypatch.setattr(CheckpointStore, "restore", lambda *_a, **_k: pytest.fail("read for nothing"))

    assert run_dispatch(job.pk, job.dispatch_token, here) == RunOutcome.YIELDED
    reason = f"{DURING_RESTORE} (after its setup, before reading its checkpoint)"
    assert Job.objects.get(pk=job.pk).events.filter(reason__endswith=reason).exists()


def test_a_restore_goes_on_at_the_cost_of_one_broker_read_when_a_free_gpu_took_the_rt_job(alice, monkeypatch):
    job, _first = _checkpointed_elsewhere(alice)
    here = Runtime(WorkerIdentity("gpu0@test", 0))

    def taken_elsewhere():
        rt = rt_job_arrives(alice, here)
        # A free GPU took its message off the queue and claimed it
        client().delete("rt")
        Job.objects.filter(pk=rt.pk).update(state="running", worker="gpu7@elsewhere")

    # The order is not read during the restore (the slice's own boundary reads it, as always)
    restoring, displacing = [False], order.displacing

    def restore(self):
        restoring[0] = True
        try:
            return real_restore(self)
        finally:
            restoring[0] = False

    def not_while_restoring(*args, **kwargs):
        assert not restoring[0], "read the order for nothing"
        return displacing(*args, **kwargs)

    real_restore = Restore.workload
    monkeypatch.setattr(Restore, "workload", restore)
    monkeypatch.setattr(order, "displacing", not_while_restoring)
    # The writer gives up on generation 2 while the worker waits for it; the restore then
    # falls back to 1.
    in_flight = job.checkpoint_files[0]
    when_asked_for_the_writer_of(in_flight, lambda: persists.unmark(client(), job.pk, in_flight), monkeypatch)

    with after_the_claim(taken_elsewhere):
        run_dispatch(job.pk, job.dispatch_token, here)

    after = Job.objects.get(pk=job.pk)
    assert not after.events.filter(reason__contains="during its restore").exists()
    assert after.events.filter(reason__contains="restored generation 1").exists()
    assert after.slices.order_by("-id").first().steps > 0
    assert not here.threads.interrupts.urgent.is_set()  # looked at, and answered


def test_an_rt_job_does_not_wait_for_a_command_jobs_program_to_start(operator, monkeypatch):
    # The program never installs its SIGUSR1 handler; the worker waits for that at a claim (so
    # a slice is not spent starting it), for a while, but not while an RT job waits.
    code = "import time; time.sleep(30)"
    job = submit(operator, "SP", "slow-start", workload="command", argv=[program_python(), "-c", code], step_ms=10)
    here = Runtime(WorkerIdentity("gpu0@test", 0))
    catches_signal = command.catches_signal

    arrived: list[Job] = []

    def starting(pid, signum):  # the worker looks for the handler: the program is starting
        if not arrived:
            arrived.append(rt_job_arrives(operator, here))
        return catches_signal(pid, signum)

    monkeypatch.setattr(command, "catches_signal", starting)

    assert run_dispatch(job.pk, job.dispatch_token, here) == RunOutcome.YIELDED

    after = Job.objects.get(pk=job.pk)
    assert after.state == "queued" and after.checkpoint_files == [] and after.failures == 0
    assert after.events.filter(
        reason=f"{MADE_WAY}{arrived[0].pk} {DURING_RESTORE} (while its program started)"
    ).exists()
