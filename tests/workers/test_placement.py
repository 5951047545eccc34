"""A job that declares its GPU memory runs only where it fits, or waits saying why."""

from __future__ import annotations

import pytest
from django.test import override_settings

from clockq.jobs import services, workloads
from clockq.jobs.models import Job
from control.reconcile import reconcile_queued_jobs
from tests.harness import wait_for
from tests.helpers import submit, wait_finished

pytestmark = pytest.mark.integration

SMALL_AND_LARGE = {"CLOCKQ_SIM_GPU_MEMORY_MIB": "16384,81920"}


def submit_needing(owner, mib: int, name: str) -> Job:
    params = workloads.validate("synthetic", {"steps": 10, "step_ms": 5}, may_run_commands=False)
    return services.submit_job(
        owner=owner, name=name, tier_code="SP", workload="synthetic", params=params, gpu_mem_mib=mib
    )


@override_settings(CLOCKQ_REDISPATCH_GRACE_S=0)
def test_a_big_job_runs_on_the_larger_gpu(start_workers, alice):
    start_workers(gpus=2, **SMALL_AND_LARGE)
    jobs = [submit_needing(alice, 40_000, f"big{i}") for i in range(4)]

    def all_done():
        reconcile_queued_jobs()  # beat does this every 15 s; here, as often as the test polls
        return all(j.state == "succeeded" for j in Job.objects.filter(pk__in=[j.pk for j in jobs]))

    wait_for(all_done, 60, interval=0.3, what="the big jobs to finish")
    for job in Job.objects.filter(pk__in=[j.pk for j in jobs]):
        assert set(job.slices.values_list("gpu_index", flat=True)) == {1}


@override_settings(CLOCKQ_REDISPATCH_GRACE_S=0)
def test_a_job_that_fits_nowhere_stays_queued_with_the_reason(start_workers, alice, client):
    start_workers(gpus=2, **SMALL_AND_LARGE)
    huge = submit_needing(alice, 200_000, "huge")
    small = submit(alice, "SP", "small", steps=5, step_ms=1)

    wait_for(lambda: Job.objects.get(pk=huge.pk).placement_note, 20, what="a worker to refuse the job")
    reconcile_queued_jobs()
    wait_for(lambda: Job.objects.get(pk=huge.pk).placement_note, 20, what="a second refusal")
    (small,) = wait_finished(small)

    huge.refresh_from_db()
    assert huge.state == "queued" and not huge.slices.exists()
    assert "needs 200000 MiB" in huge.placement_note
    client.force_login(alice)
    assert "needs 200000 MiB" in client.get(f"/jobs/{huge.pk}/").content.decode()
