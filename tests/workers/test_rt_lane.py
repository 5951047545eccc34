"""Pause in place with a standby RT lane (workers/rt_lane.py, CLOCKQ_RT_LANE=on), on real worker
processes through a real broker: `gpuworkers` starts a GPU's main worker and its RT lane."""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from clockq.bus import lanes
from clockq.bus.client import client
from clockq.jobs import services, workloads
from clockq.jobs.models import Job, JobEvent, QueueTier
from clockq.jobs.results import ResultStore
from clockq.policy.states import TERMINAL_STATES
from control.reaper import reap_expired_leases
from tests.harness import wait_for
from tests.helpers import assert_no_overlap, claims, set_consuming, wait_finished
from workers.lane_life import LaneLock
from workers.workloads.synthetic import _HEADER, _payload

pytestmark = pytest.mark.integration

STATE_KB = 8 * 1024


def _submit(owner, tier: str, name: str, *, gpu_mem_mib: int, **params) -> Job:
    cleaned = workloads.validate("synthetic", params, may_run_commands=False)
    return services.submit_job(
        owner=owner, name=name, tier_code=tier, workload="synthetic", params=cleaned, gpu_mem_mib=gpu_mem_mib
    )


def _start(start_workers, **env: str):
    workers = start_workers(gpus=1, CLOCKQ_RT_LANE="on", CLOCKQ_LANE_LOCK_DIR=_lock_dir(), **env)
    lane = f"rt0@{settings.CLOCKQ_HOST}"

    def lane_ready():
        workers.check_alive()
        beat = client().get(f"clockq:worker:{lane}")
        return beat is not None and client().zscore(lanes.IDLE_KEY, lane) is not None

    wait_for(lane_ready, 60, interval=0.1, what="the RT lane to be ready and idle")
    return workers, lane


def _lock_dir() -> str:
    """The lanes' life locks in the test's own folder: a lane of an earlier test, still
    stopping, holds the one under var/ for the same broker."""
    return str(settings.CLOCKQ_CHECKPOINT_DIR.parent / "lanes")


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


# A GPU whose RT job fits beside its running job pauses that job in place; one whose RT job
# does not makes it leave through a checkpoint, and its worker waits, lent, until the RT job ends.
MEMORY_BY_PATH = {"pause": "16384", "checkpoint": "10000"}


@pytest.mark.parametrize("path", ["pause", "checkpoint"])
@override_settings(CLOCKQ_LEASE_S=2.0)
def test_kill_9_of_the_lane_starts_its_rt_job_again_within_rt_start_timeout(start_workers, alice, path):
    # Given a GPU whose main job made room for an RT job in the lane (paused in place, or left
    # through a checkpoint), the pause bound at its default as in production (2 s), and the lease
    # short enough that the reaper would take the RT job back in seconds
    _workers, lane = _start(start_workers, CLOCKQ_LEASE_S="2", CLOCKQ_SIM_GPU_MEMORY_MIB=MEMORY_BY_PATH[path])
    big = _submit(alice, "SP", "big", gpu_mem_mib=8192, steps=300, step_ms=10, state_kb=64)
    _running(big)
    main = Job.objects.get(pk=big.pk).worker
    rt = _submit(alice, "RT", "long-inference", gpu_mem_mib=4096, steps=300, step_ms=10)
    wait_for(lambda: Job.objects.get(pk=rt.pk).worker == lane, 30, what="the RT job in the lane")
    wait_for(lambda: lanes.pause_request(client(), main) is not None, 30, what="the pause request")
    # (counted just after the lane's claim, which the test may see first)
    wait_for(lambda: lanes.served() == {path: 1}, 30, what="the lane's path counted")

    # When the lane is killed with kill -9 in the middle of its RT job
    killed_at = timezone.now()
    os.kill(_pid(lane), signal.SIGKILL)
    big, rt = _finished_with_a_reaper(big, rt)

    # Then its GPU's main worker took the RT job back at once, and it started again within RT's
    # start timeout of the kill (on this GPU, or in the lane's next process)
    assert big.state == rt.state == "succeeded"
    taken = rt.events.filter(from_state="running", to_state="queued").first()  # its first leave: the lane's end
    _assert_started_again_within_start_timeout(rt, taken, killed_at)
    assert taken.actor == main and f"its worker {lane} died" in taken.reason, (taken.actor, taken.reason)
    assert rt.slices.filter(outcome="lost").count() == 1
    # The main job lost nothing: each of its steps ran once, and it never ran beside itself
    assert not big.slices.filter(outcome="lost").exists()
    assert sum(big.slices.values_list("steps", flat=True)) == 300
    if path == "pause":
        # It resumed when the lane died, not at the pause's bound; if the lane's next process
        # ran the RT job again beside it, that pause ended as any other
        first, *again = [p["how"] for p in lanes.pauses() if p["rt_job"] == rt.pk]
        assert first == "resumed: lane gone"
        assert "resumed: lane gone" not in again
    assert_no_overlap(big)
    assert_no_overlap(rt)


@override_settings(CLOCKQ_LEASE_S=2.0)
def test_kill_9_of_the_lane_on_an_idle_gpu_gives_its_rt_job_to_the_main_worker_within_rt_start_timeout(
    start_workers, alice
):
    # Given an idle GPU whose lane took an RT job: its main worker took no rt messages meanwhile
    # (Celery's own remote control), and takes them again now, idle
    _workers, lane = _start(start_workers, CLOCKQ_LEASE_S="2")
    main = lanes.main_of(lane)
    _rt_consumer(main, consume=False)
    rt = _submit(alice, "RT", "long-inference", gpu_mem_mib=1024, steps=300, step_ms=10)
    wait_for(lambda: Job.objects.get(pk=rt.pk).worker == lane, 30, what="the RT job in the lane")
    assert lanes.served() == {"free": 1}
    _consume_rt_again(main)

    # When the lane is killed with kill -9 in the middle of it
    killed_at = timezone.now()
    os.kill(_pid(lane), signal.SIGKILL)
    (rt,) = _finished_with_a_reaper(rt)

    # Then the main worker took it back at once, and it started again within RT's start timeout
    assert rt.state == "succeeded"
    taken = rt.events.filter(from_state="running", to_state="queued").first()  # its first leave: the lane's end
    _assert_started_again_within_start_timeout(rt, taken, killed_at)
    assert taken.actor == main, (taken.actor, taken.reason)
    assert_no_overlap(rt)


def test_a_lane_takes_no_rt_job_while_another_process_holds_its_life_lock(start_workers, alice):
    # Given the lane's life lock held by another process of this host, as by a process of the
    # lane before it that is not dead yet (and might still run the job it took)
    lane = f"rt0@{settings.CLOCKQ_HOST}"
    held = LaneLock(lane, _lock_dir(), settings.REDIS_URL)
    assert held.try_take()
    workers = start_workers(gpus=1, CLOCKQ_RT_LANE="on", CLOCKQ_LANE_LOCK_DIR=_lock_dir())
    wait_for(lambda: "waiting for its life lock" in workers.log_path.read_text(), 60, what="the lane to wait")

    # When an RT job comes, the lane takes no message: the GPU's main worker runs it
    (rt,) = wait_finished(_submit(alice, "RT", "inference", gpu_mem_mib=1024, steps=5, step_ms=5))
    assert rt.state == "succeeded" and rt.worker == lanes.main_of(lane)
    assert client().get(f"clockq:worker:{lane}") is None and lanes.served() == {}

    # Then, once the lock comes free, the lane starts
    held.release()
    wait_for(lambda: client().zscore(lanes.IDLE_KEY, lane) is not None, 60, what="the lane to start")


def test_a_lane_whose_lock_folder_others_may_write_in_does_not_start_and_says_why(start_workers, alice):
    # Given a lock folder anyone may write in: another user could put a file of theirs in place
    # of the lane's lock, and make the live lane look dead to its main worker
    lock_dir = Path(_lock_dir())
    lock_dir.mkdir()
    lock_dir.chmod(0o777)
    workers = start_workers(gpus=1, CLOCKQ_RT_LANE="on", CLOCKQ_LANE_LOCK_DIR=str(lock_dir))

    # Then the lane stops at its start, saying why, and the GPU's main worker serves RT alone
    why = f"RT lane rt0@{settings.CLOCKQ_HOST} cannot start: {lock_dir} (CLOCKQ_LANE_LOCK_DIR) must be a folder"
    wait_for(lambda: why in workers.log_path.read_text(), 60, what="the lane's refusal")
    (rt,) = wait_finished(_submit(alice, "RT", "inference", gpu_mem_mib=1024, steps=5, step_ms=5))
    assert rt.state == "succeeded" and rt.worker == f"gpu0@{settings.CLOCKQ_HOST}"
    assert lanes.served() == {}


def _rt_consumer(worker: str, consume: bool) -> None:
    """Stop or start `worker`'s consuming of the rt queue."""
    set_consuming(worker, "rt", consume)


def _consume_rt_again(main: str) -> None:
    """`main` takes rt messages again: once Celery has added the queue back, and the worker's
    next wait on the broker names it (the wait in flight, up to a second long, does not: the
    broker's own record of the commands, MONITOR, shows it). The lane, busy, waits on nothing."""
    watch = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=30)
    with watch.monitor() as commands:
        _rt_consumer(main, consume=True)
        for command in commands.listen():
            words = command["command"].split()
            if words[:1] == ["BRPOP"] and {"rt", "hp"} <= set(words):  # the main worker's, all queues
                return


def _finished_with_a_reaper(*jobs: Job) -> list[Job]:
    """The jobs once they have finished, with the reaper running meanwhile as the control role
    runs it: without another way back, a dead lane's RT job comes back with it (CLOCKQ_LEASE_S)."""
    ids = [j.pk for j in jobs]

    def finished():
        reap_expired_leases()
        found = list(Job.objects.filter(pk__in=ids).order_by("pk"))
        return found if all(j.state in TERMINAL_STATES for j in found) else None

    return wait_for(finished, 120, interval=0.1, what=f"jobs {ids} to finish")


def _assert_started_again_within_start_timeout(rt: Job, taken: JobEvent, killed_at) -> None:
    """The recorded claim of `rt` after its take-back came within RT's start timeout of the kill."""
    again = rt.events.filter(from_state="queued", to_state="running", at__gte=taken.at).first()
    timeout_ms = QueueTier.objects.get(code="RT").start_timeout_ms
    started_ms = (again.at - killed_at).total_seconds() * 1000
    assert started_ms <= timeout_ms, f"RT job started again {started_ms:.0f} ms after its lane was killed"


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
    workers = start_workers(
        gpus=2,
        CLOCKQ_RT_LANE="on",
        CLOCKQ_SIM_GPU_MEMORY_MIB="16384",
        CLOCKQ_PAUSE_MAX_S="600",
        CLOCKQ_LANE_LOCK_DIR=_lock_dir(),
    )
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
