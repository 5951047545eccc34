"""`clockq drain`, `resume` and `hosts` against a live server and real GPU workers: a drained
GPU's job goes back to its queue and runs on the other GPU, `--wait` returns once none runs
there, and only staff may drain."""

from __future__ import annotations

import socket

import pytest

from clockq.jobs.models import Job
from tests.clockq_cli.conftest import no_traceback
from tests.harness import wait_for
from tests.helpers import submit, wait_finished

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

HOST = socket.gethostname()


def test_drain_waits_for_the_gpu_to_empty_and_resume_brings_it_back(clockq, clockq_as_carol, start_workers, alice):
    # Given two GPUs, each running a long job
    start_workers(gpus=2, CLOCKQ_CHECKPOINT_EVERY_S="0.2")
    jobs = [submit(alice, "SP", f"long-{i}", steps=300, step_ms=10, state_kb=4) for i in range(2)]
    wait_for(lambda: Job.objects.filter(state="running").count() == 2, 30, what="both jobs to run")
    gpu0 = f"gpu0@{HOST}"

    # A user who is not staff may look, not drain; a name nobody registered is not found
    refused = clockq("drain", gpu0)
    assert refused.code == 4, refused.err
    no_traceback(refused)
    unknown = clockq_as_carol("drain", "gpu7@nowhere")
    assert unknown.code == 5, unknown.err
    no_traceback(unknown)

    # When staff drains gpu0 and waits
    drained = clockq_as_carol("drain", gpu0, "--reason", "fan swap", "--wait", "--json", timeout=120)

    # Then it returns once no job runs there, drained by carol for the reason given
    assert drained.code == 0, drained.err
    worker = drained.json()
    assert worker["name"] == gpu0 and worker["drained"] and worker["running_jobs"] == []
    assert (worker["drained_by"], worker["drain_reason"]) == ("carol", "fan swap")
    # And `hosts` shows it so, with its host
    (host,) = [h for h in clockq("hosts", "--json").json()["hosts"] if h["name"] == HOST]
    assert {w["name"]: w["drained"] for w in host["workers"]}[gpu0] is True
    table = clockq("hosts")
    assert table.code == 0 and "by carol: fan swap" in table.out
    # Both jobs still finish: the drained GPU's on the other one
    assert all(j.state == "succeeded" for j in wait_finished(*jobs, timeout=180))

    # When it is resumed, it is no longer drained
    resumed = clockq_as_carol("resume", gpu0, "--json")
    assert resumed.code == 0, resumed.err
    assert resumed.json()["drained"] is False
