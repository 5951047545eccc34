"""An RT lane's life lock (workers/lane_life.py): the kernel lets it go the instant the lane's
process dies, and whoever holds it takes back the dead lane's jobs, by the reaper's rule."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from django.conf import settings
from django.utils import timezone

from clockq.bus import lanes
from clockq.bus.client import client
from clockq.jobs.models import Job
from tests.harness import ROOT
from tests.helpers import submit
from workers import lane_life
from workers.lane_life import LaneLock, LaneLockError, LaneWatch, take_back_orphans

LANE = f"rt0@{settings.CLOCKQ_HOST}"
MAIN = f"gpu0@{settings.CLOCKQ_HOST}"


def _holder(directory) -> subprocess.Popen:
    """Another process that takes the lane's lock, says so on stdout, and waits to be killed."""
    code = textwrap.dedent(
        f"""
        import django, sys
        django.setup()
        from workers.lane_life import LaneLock
        lock = LaneLock({LANE!r}, {str(directory)!r}, {settings.REDIS_URL!r})
        assert lock.try_take()
        print("held", flush=True)
        sys.stdin.read()
        """
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "clockq.settings"}
    holder = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert holder.stdout.readline() == b"held\n"
    return holder


def test_a_lanes_lock_comes_free_the_instant_its_process_is_killed(tmp_path):
    # Given a process (the lane) holding its lock
    holder = _holder(tmp_path)
    lock = LaneLock(LANE, tmp_path, settings.REDIS_URL)
    try:
        assert not lock.try_take()  # alive: the lock is not to be had

        # When it is killed with kill -9
        os.kill(holder.pid, signal.SIGKILL)

        # Then a wait on the lock returns: its holder is dying (its files closed), and no one
        # else holds it now
        assert lock.take() and lock.held
        assert holder.wait() == -signal.SIGKILL
    finally:
        holder.kill()
        holder.wait()
        lock.release()


def test_a_lane_of_another_broker_on_the_same_host_has_a_lock_of_its_own(tmp_path):
    # Two deployments on one host (two test runs) each have an rt0@<host>
    holder = _holder(tmp_path)
    try:
        other = LaneLock(LANE, tmp_path, "redis://127.0.0.1:1/0")
        assert other.try_take()
        assert not LaneLock(LANE, tmp_path, settings.REDIS_URL).try_take()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("mode", [0o777, 0o770], ids=["everyone", "group"])
def test_a_lock_folder_that_others_may_write_in_is_refused_with_a_clear_error(tmp_path, mode):
    # Another user could put a file of theirs in place of the lock and make a live lane look dead
    folder = tmp_path / "lanes"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(LaneLockError, match="CLOCKQ_LANE_LOCK_DIR"):
        LaneLock(LANE, folder).try_take()


def test_the_holder_of_a_dead_lanes_lock_takes_back_its_job_and_drops_its_pause_request(transactional_db, alice):
    # Given an RT job left running under a dead lane's name, with the pause it asked of its GPU
    rt = submit(alice, "RT", "inference", steps=5)
    Job.objects.filter(pk=rt.pk).update(state="running", worker=LANE, slice_started_at=timezone.now())
    request = lanes.PauseRequest(rt_job=rt.pk, lane=LANE, mode=lanes.MODE_PAUSE, target=None)
    lanes.request_pause(client(), MAIN, request)
    old_token = Job.objects.get(pk=rt.pk).dispatch_token

    # When the holder of the lane's lock takes back its orphans
    taken = take_back_orphans(LANE, actor=MAIN)

    # Then the job is queued again with a new token, its lost slice recorded, and the pause is over
    rt.refresh_from_db()
    assert taken == [rt.pk]
    assert rt.state == "queued" and rt.dispatch_token != old_token and rt.worker == ""
    event = rt.events.get(from_state="running", to_state="queued")
    assert event.actor == MAIN and event.reason.startswith(f"its worker {LANE} died")
    assert rt.slices.get().outcome == "lost" and rt.slices.get().gpu_index == 0
    assert lanes.pause_request(client(), MAIN) is None
    # A second pass finds nothing to take back
    assert take_back_orphans(LANE, actor=MAIN) == []


def test_a_pause_request_of_another_lane_stays(transactional_db, alice):
    # A request is dropped only for the dead lane that made it
    request = lanes.PauseRequest(rt_job=1, lane="rt1@elsewhere", mode=lanes.MODE_PAUSE, target=None)
    lanes.request_pause(client(), MAIN, request)
    take_back_orphans(LANE, actor=MAIN)
    assert lanes.pause_request(client(), MAIN) == request


def test_a_pause_says_lane_gone_only_if_the_lane_died_during_it(transactional_db, alice, tmp_path, monkeypatch):
    # Given a main worker's watch that took back an RT job from its dead lane (no process holds
    # the lane's lock, so the watch takes it at once), during a pause that began before that
    rt = submit(alice, "RT", "inference", steps=5)
    Job.objects.filter(pk=rt.pk).update(state="running", worker=LANE, slice_started_at=timezone.now())
    watch = LaneWatch(MAIN, LaneLock(LANE, tmp_path, settings.REDIS_URL))
    monkeypatch.setattr(lane_life, "_watch", watch)
    first_pause_began = time.monotonic()
    assert watch.watch_once() == [rt.pk]

    # Then that pause's record says the lane is gone; a later pause for the same RT job, run
    # again in the lane's next process, ends as any other
    assert lane_life.lane_lost(rt.pk, since=first_pause_began)
    assert not lane_life.lane_lost(rt.pk, since=time.monotonic())
