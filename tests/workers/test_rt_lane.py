"""Pause in place with a standby RT lane (workers/rt_lane.py, CLOCKQ_RT_LANE=on), on real worker
processes through a real broker: `gpuworkers` starts a GPU's main worker and its RT lane."""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings

from clockq.bus import lanes
from clockq.bus.client import client
from clockq.jobs import services, workloads
from clockq.jobs.models import Job
from clockq.jobs.results import ResultStore
from control.reaper import reap_expired_leases
from tests.harness import wait_for
from tests.helpers import assert_no_overlap, claims, wait_finished
from workers.workloads.synthetic import _HEADER, _payload

pytestmark = pytest.mark.integration

STATE_KB = 8 * 1024


def _submit(owner, tier: str, name: str, *, gpu_mem_mib: int, **params) -> Job:
    cleaned = workloads.validate("synthetic", params, may_run_commands=False)
    return services.submit_job(
        owner=owner, name=name, tier_code=tier, workload="synthetic", params=cleaned, gpu_mem_mib=gpu_mem_mib
    )


def _start(start_workers, **env: str):
    workers = start_workers(gpus=1, CLOCKQ_RT_LANE="on", **env)
    lane = f"rt0@{settings.CLOCKQ_HOST}"

    def lane_ready():
        workers.check_alive()
        beat = client().get(f"clockq:worker:{lane}")
        return beat is not None and client().zscore(lanes.IDLE_KEY, lane) is not None

    wait_for(lane_ready, 60, interval=0.1, what="the RT lane to be ready and idle")
    return workers, lane


def _running(job: Job, slices: int = 1) -> None:
    wait_for(lambda: Job.objects.get(pk=job.pk).slice_count >= slices, 30, what=f"job {job.pk} to run")


def _pid(worker: str) -> int:
    return json.loads(client().get(f"clockq:worker:{worker}"))["pid"]


def _state_bin(job: Job) -> bytes:
    with ResultStore(settings.CLOCKQ_CHECKPOINT_DIR).open(job.pk, "state.bin") as f:
        return f.read()


def test_an_rt_job_that_fits_runs_in_the_lane_while_the_big_job_pauses_in_place(start_workers, alice):
    _workers, lane = _start(start_workers, CLOCKQ_SIM_GPU_MEMORY_MIB="16384", CLOCKQ_PAUSE_MAX_S="600")
    # The lane's heartbeat says whose lane it is, and counts as no GPU of its own
    beat = json.loads(client().get(f"clockq:worker:{lane}"))
    assert beat["gpu"] is None and beat["rt_lane_gpu"] == 0 and beat["rt_lane_of"].startswith("gpu0@")
    big = _submit(alice, "SP", "big", gpu_mem_mib=8192, steps=300, step_ms=10, state_kb=STATE_KB)
    _running(big)

    rt = _submit(alice, "RT", "inference", gpu_mem_mib=4096, steps=20, step_ms=5)
    big, rt = wait_finished(big, rt)

    assert big.state == rt.state == "succeeded"
    assert rt.worker == lane and big.worker.startswith("gpu0@")
    assert big.first_started_at < rt.first_started_at and rt.finished_at < big.finished_at
    # Served by pausing in place: no checkpoint, no yield, one claim of the big job
    assert lanes.served() == {"pause": 1}
    (pause,) = lanes.pauses()
    assert pause["job"] == big.pk and pause["rt_job"] == rt.pk and pause["how"] == "resumed"
    assert big.checkpoint_generation == 0 and not big.checkpoint_files
    assert not big.slices.exclude(outcome__in=["continued", "completed"]).exists()
    assert claims(big) == 1
    # The pause is on its slice, apart from its service
    assert sum(big.slices.values_list("paused_ms", flat=True)) == pytest.approx(pause["paused_ms"])
    # Its state resumed bitwise as it was: every step once, the device memory untouched
    assert _state_bin(big) == _HEADER.pack(300, STATE_KB * 1024) + _payload(big.pk, STATE_KB * 1024)


def test_an_rt_job_runs_in_the_lane_while_the_running_job_is_still_setting_up(start_workers, alice):
    # A job's setup (a model build, a data load) cannot be cut short; without a lane an RT job
    # would wait for it, past RT's start timeout.
    _workers, lane = _start(start_workers, CLOCKQ_PAUSE_MAX_S="600")
    slow = _submit(alice, "SP", "slow-setup", gpu_mem_mib=1024, steps=5, step_ms=1, setup_ms=10_000)
    wait_for(lambda: Job.objects.get(pk=slow.pk).state == "running", 30, what="the slow job's claim")

    rt = _submit(alice, "RT", "inference", gpu_mem_mib=1024, steps=2, step_ms=1)
    (rt,) = wait_finished(rt)
    (slow,) = wait_finished(slow)

    assert rt.state == slow.state == "succeeded"
    assert rt.worker == lane and lanes.served() == {"pause": 1}
    # The RT job ended before the slow job's setup did; the slow job never left its GPU
    (first, *_) = slow.slices.order_by("started_at")
    assert rt.finished_at < first.started_at + timedelta(milliseconds=first.restore_ms)
    assert claims(slow) == 1 and not slow.slices.filter(outcome="yielded").exists()


def test_an_rt_job_that_does_not_fit_beside_the_running_job_takes_the_checkpoint_path(start_workers, alice):
    _workers, lane = _start(start_workers, CLOCKQ_SIM_GPU_MEMORY_MIB="10000", CLOCKQ_PAUSE_MAX_S="600")
    big = _submit(alice, "SP", "big", gpu_mem_mib=8192, steps=300, step_ms=10, state_kb=STATE_KB)
    _running(big)

    rt = _submit(alice, "RT", "inference", gpu_mem_mib=4096, steps=20, step_ms=5)
    big, rt = wait_finished(big, rt)

    assert big.state == rt.state == "succeeded"
    assert rt.worker == lane
    assert lanes.served() == {"checkpoint": 1} and lanes.pauses() == []
    # The big job left through a checkpoint for the RT job, and came back from it
    left = big.slices.get(outcome="yielded")
    assert big.checkpoint_generation >= 1
    assert big.events.filter(reason__contains=f"RT job #{rt.pk} in this GPU's RT lane").exists()
    assert left.ended_at <= rt.first_started_at
    assert claims(big) == 2
    assert_no_overlap(big)
    assert _state_bin(big) == _HEADER.pack(300, STATE_KB * 1024) + _payload(big.pk, STATE_KB * 1024)


@override_settings(CLOCKQ_LEASE_S=2.0)
def test_kill_9_of_the_lane_resumes_the_paused_job_and_loses_nothing(start_workers, alice):
    _workers, lane = _start(start_workers, CLOCKQ_LEASE_S="2", CLOCKQ_PAUSE_MAX_S="600")
    big = _submit(alice, "SP", "big", gpu_mem_mib=1024, steps=300, step_ms=10, state_kb=64)
    _running(big)
    main = Job.objects.get(pk=big.pk).worker
    rt = _submit(alice, "RT", "long-inference", gpu_mem_mib=1024, steps=300, step_ms=10)
    wait_for(lambda: Job.objects.get(pk=rt.pk).worker == lane, 30, what="the RT job in the lane")
    wait_for(lambda: lanes.pause_request(client(), main) is not None, 30, what="the pause request")

    os.kill(_pid(lane), signal.SIGKILL)

    # The request expires with its lane: the big job resumes where it was and finishes
    wait_for(lambda: any(p["how"] == "resumed: lane gone" for p in lanes.pauses()), 30, what="the resume")
    # The lane's RT job goes back to its queue with the reaper, and runs again from its start
    wait_for(lambda: reap_expired_leases() == 1, 30, interval=0.2, what="the reaper to take the RT job back")
    big, rt = wait_finished(big, rt, timeout=120)

    assert big.state == rt.state == "succeeded"
    # The big job lost nothing: each of its steps ran once. (The RT job's second run may take
    # the restarted lane, or, before that lane is back, make the big job leave by checkpoint.)
    assert not big.slices.filter(outcome="lost").exists()
    assert sum(big.slices.values_list("steps", flat=True)) == 300
    assert rt.slices.filter(outcome="lost").count() == 1
    assert_no_overlap(big)
    assert_no_overlap(rt)


@override_settings(CLOCKQ_LEASE_S=2.0)
def test_kill_9_of_the_paused_worker_loses_only_its_slice(start_workers, alice):
    _workers, lane = _start(start_workers, CLOCKQ_LEASE_S="2", CLOCKQ_PAUSE_MAX_S="600")
    big = _submit(alice, "SP", "big", gpu_mem_mib=1024, steps=200, step_ms=10, state_kb=64)
    _running(big)
    main = Job.objects.get(pk=big.pk).worker
    rt = _submit(alice, "RT", "inference", gpu_mem_mib=1024, steps=300, step_ms=10)
    wait_for(lambda: Job.objects.get(pk=rt.pk).worker == lane, 30, what="the RT job in the lane")
    wait_for(lambda: lanes.pause_request(client(), main) is not None, 30, what="the pause request")

    os.kill(_pid(main), signal.SIGKILL)

    wait_for(lambda: reap_expired_leases() == 1, 30, interval=0.2, what="the reaper to take the big job back")
    big, rt = wait_finished(big, rt, timeout=120)

    # The RT job ran once, in the lane; the big job lost its slice and ran again
    assert big.state == rt.state == "succeeded"
    assert claims(rt) == 1 and rt.worker == lane
    assert big.slices.filter(outcome="lost").count() == 1
    assert not rt.slices.exclude(outcome__in=["continued", "completed"]).exists()
    assert_no_overlap(big)
    assert lanes.pause_request(client(), main) is None  # the lane gave the room back


def test_an_rt_job_goes_to_a_gpu_that_runs_nothing_rather_than_pause_a_job(start_workers, alice):
    # Given two GPUs with their lanes, one running a long job and the other idle
    workers = start_workers(gpus=2, CLOCKQ_RT_LANE="on", CLOCKQ_SIM_GPU_MEMORY_MIB="16384", CLOCKQ_PAUSE_MAX_S="600")
    names = [f"rt{i}@{settings.CLOCKQ_HOST}" for i in range(2)]

    def ready():
        workers.check_alive()
        return all(client().zscore(lanes.IDLE_KEY, name) is not None for name in names)

    wait_for(ready, 60, interval=0.1, what="both RT lanes to be ready and idle")
    big = _submit(alice, "SP", "big", gpu_mem_mib=1024, steps=3000, step_ms=10)
    _running(big)
    busy = Job.objects.get(pk=big.pk).worker
    idle_gpu = 1 - int(busy.split("@")[0].removeprefix("gpu"))

    # When an RT job comes, whichever lane's message it is
    (rt,) = wait_finished(_submit(alice, "RT", "inference", gpu_mem_mib=1024, steps=5, step_ms=5))

    # Then it runs on the idle GPU, and the long job never paused nor left
    assert rt.state == "succeeded"
    assert rt.worker.split("@")[0] in (f"gpu{idle_gpu}", f"rt{idle_gpu}"), rt.worker
    assert "pause" not in lanes.served() and "checkpoint" not in lanes.served()
    big.refresh_from_db()
    assert big.state == "running" and big.worker == busy and claims(big) == 1
