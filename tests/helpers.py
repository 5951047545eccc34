"""Small helpers for tests that submit jobs and wait on them."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator

from django.db import connection

from clockq.jobs import services, workloads
from clockq.jobs.models import Job
from clockq.policy.states import TERMINAL_STATES
from tests.harness import wait_for

# A service ladder in tens of milliseconds (CLOCKQ_SERVICE_LADDER_S): in a test that lasts
# seconds, jobs of one tier then take turns by attained service as under LAS, where the default
# ladder (minutes of GPU time) would let the first of them run to its end.
SHORT_LADDER = [0.02 * 2**i for i in range(14)]


@contextlib.contextmanager
def after_the_claim(then: Callable[[], object]) -> Iterator[None]:
    """Call `then()` each time a worker in this process has just claimed a job: what arrives
    there arrives once the worker holds its job (before it, a job that comes first in the order
    would be claimed instead)."""
    from workers import slice_runner

    real = slice_runner.claim_job

    def claim(job_id, token, runtime):
        claimed = real(job_id, token, runtime)
        then()
        return claimed

    slice_runner.claim_job = claim
    try:
        yield
    finally:
        slice_runner.claim_job = real


@contextlib.contextmanager
def after_the_restore(then: Callable[[], object]) -> Iterator[None]:
    """Call `then()` each time a worker in this process has restored a claimed job's workload:
    what arrives there finds the job running (an urgent job that came before would take the GPU
    during the restore instead)."""
    from workers.run.restore import Restore

    real = Restore.workload

    def workload(self):
        restored = real(self)
        then()
        return restored

    Restore.workload = workload
    try:
        yield
    finally:
        Restore.workload = real


def yield_once(job: Job, runtime) -> Job:
    """Run one dispatch of `job` in this process: an HP job arrives once it is restored, so it
    yields at its next step (HP interrupts; the HP job is then cancelled, so the next dispatch
    claims `job` again). Returns the job as its yield left it, its checkpoint written."""
    from workers.slice_runner import RunOutcome, run_dispatch

    rivals: list[Job] = []
    with after_the_restore(lambda: rivals.append(submit(job.owner, "HP", "rival", steps=1))):
        assert run_dispatch(job.pk, job.dispatch_token, runtime) == RunOutcome.YIELDED
    Job.objects.filter(pk__in=[r.pk for r in rivals]).update(state="cancelled")
    runtime.persister.flush()  # its checkpoint is written in the background
    not_free(runtime)
    return Job.objects.get(pk=job.pk)


def not_free(runtime) -> None:
    """A Runtime a test drives in its own process left its job, but no worker stands behind it
    to take the next one: it must not count as a free GPU (clockq/bus/free_gpus.py), or another
    runtime's job would not make way while its mark lasts."""
    from clockq.bus import free_gpus
    from clockq.bus.client import client

    runtime.threads.boundary_reader.submit(lambda: None).result(timeout=30)  # a read there may mark it
    client().zrem(free_gpus.KEY, runtime.identity.hostname)


def token_auth(user, days: int | None = None) -> dict:
    """Test-client keyword arguments that authenticate as `user` with a new API token."""
    from datetime import timedelta

    from knox.models import AuthToken

    kwargs = {} if days is None else {"expiry": timedelta(days=days)}
    _instance, token = AuthToken.objects.create(user=user, **kwargs)
    return {"HTTP_AUTHORIZATION": f"Token {token}"}


def post_form(client, path: str, data: dict, **extra):
    """Post `data` url-encoded, as a browser posts a form (the test client's default is multipart)."""
    from urllib.parse import urlencode

    return client.post(path, urlencode(data), content_type="application/x-www-form-urlencoded", **extra)


def submit(owner, tier: str = "SP", name: str = "job", workload: str = "synthetic", **params) -> Job:
    cleaned = workloads.validate(workload, params, may_run_commands=owner.has_perm("jobs.run_command"))
    return services.submit_job(owner=owner, name=name, tier_code=tier, workload=workload, params=cleaned)


def wait_finished(*jobs: Job, timeout: float = 60) -> list[Job]:
    ids = [j.pk for j in jobs]

    def all_done():
        found = list(Job.objects.filter(pk__in=ids).order_by("pk"))
        return found if all(j.state in TERMINAL_STATES for j in found) else None

    return wait_for(all_done, timeout, interval=0.1, what=f"jobs {ids} to finish")


def claims(job: Job) -> int:
    """How many times the job was taken by a worker."""
    return job.events.filter(to_state="running").exclude(from_state="running").count()


def assert_no_overlap(job: Job) -> None:
    slices = list(job.slices.order_by("started_at"))
    for earlier, later in itertools.pairwise(slices):
        assert earlier.ended_at <= later.started_at, f"slices {earlier.pk} and {later.pk} of job {job.pk} overlap"


def database_url() -> str:
    """The test database as a URL, for worker processes."""
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    auth = f"{s['USER']}:{s['PASSWORD']}@" if s.get("PASSWORD") else f"{s['USER']}@" if s.get("USER") else ""
    return f"postgres://{auth}{s['HOST'] or 'localhost'}:{s['PORT'] or 5432}/{s['NAME']}"


def set_consuming(worker: str, queue: str, consume: bool) -> None:
    """Celery's own remote control: `worker` starts (add_consumer) or stops (cancel_consumer)
    taking messages from `queue`. Over a broker connection of its own: one from this process's
    pool may have sat idle while the session's Redis closed it, and the broadcast's health check
    then raises "Connection closed by server" instead of reconnecting (seen once in CI)."""
    from clockq.celery import app

    control = app.control.add_consumer if consume else app.control.cancel_consumer
    with app.connection_for_write() as conn:
        replies = control(queue, destination=[worker], reply=True, timeout=10, connection=conn)
    assert replies, f"{worker} did not answer"
