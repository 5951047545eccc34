"""The paused worker's side of the RT lane (workers/run/pause.py): the pause request in Redis is
the only truth; the lane's signal only wakes the worker to read it. Through a real Redis and the
process's real signal listener."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict

import pytest

from clockq.bus import lanes, signals
from clockq.bus.client import client
from tests.harness import wait_for
from workers.run.pause import PauseWatch, wait_while_lent
from workers.runtime import Runtime, WorkerIdentity

MAIN = "gpu0@pausehost"
LANE = "rt0@pausehost"


@pytest.fixture
def lanes_on(settings):
    settings.CLOCKQ_RT_LANE = True
    settings.CLOCKQ_PAUSE_MAX_S = 30.0


def _runtime() -> Runtime:
    assert signals.wait_until_listening(5.0)
    return Runtime(WorkerIdentity(MAIN, 0))


def test_a_lane_signal_that_names_a_request_not_in_the_key_does_not_pause_the_job(lanes_on):
    # Given a lane signal for this worker that carries a request (as signals once did), and no
    # request in Redis
    runtime = _runtime()
    stale = lanes.PauseRequest(rt_job=7, lane=LANE, mode=lanes.MODE_PAUSE, target=None)
    runtime.threads.interrupts.handle(
        json.dumps({"kind": "lane", "worker": MAIN, "request": json.dumps(asdict(stale))})
    )
    # When the running job looks at its next step, then nothing asks it to pause
    assert PauseWatch(runtime, job_id=3).asked() is None


def test_a_pause_request_reaches_the_running_job_once_the_lane_signals_it(lanes_on):
    runtime = _runtime()
    watch = PauseWatch(runtime, job_id=3)
    request = lanes.PauseRequest(rt_job=8, lane=LANE, mode=lanes.MODE_PAUSE, target=3)
    # Given the key set without a signal: a step costs no read, and sees nothing yet
    client().set(lanes.PAUSE_KEY + MAIN, json.dumps(asdict(request)), px=2000)
    assert watch.asked() is None
    # When the lane asks as it does (the key, then the signal)
    lanes.request_pause(client(), MAIN, request)
    wait_for(lambda: runtime.threads.interrupts.lane_hinted(MAIN), 5, what="the lane's signal")
    # Then the job's next step reads the key, and answers the request once
    assert watch.asked() == request
    watch.handled.add(request.rt_job)
    lanes.request_pause(client(), MAIN, request)  # announced again: still the same request
    wait_for(lambda: runtime.threads.interrupts.lane_hinted(MAIN), 5, what="the lane's signal")
    assert watch.asked() is None


@pytest.mark.django_db
def test_a_paused_job_resumes_when_the_lane_releases_its_request(lanes_on):
    runtime = _runtime()
    request = lanes.PauseRequest(rt_job=9, lane=LANE, mode=lanes.MODE_PAUSE, target=None)
    lanes.request_pause(client(), MAIN, request)
    wait_for(lambda: runtime.threads.interrupts.lane_hinted(MAIN), 5, what="the lane's signal")
    watch = PauseWatch(runtime, job_id=4)
    asked = watch.asked()
    assert asked == request
    # When the lane releases it from another thread, while the job holds
    released = threading.Timer(0.2, lanes.release, args=(client(), MAIN, request.rt_job))
    released.start()
    end = watch.hold(asked)
    released.join()
    # Then the job goes on where it was, having paused for the RT job's time
    assert end.leave is None
    assert end.paused_s > 0
    assert lanes.pauses()[-1]["rt_job"] == request.rt_job


def test_a_worker_whose_last_job_left_for_the_lane_claims_once_the_rt_job_ends(lanes_on):
    runtime = _runtime()
    request = lanes.PauseRequest(rt_job=10, lane=LANE, mode=lanes.MODE_CHECKPOINT, target=5)
    lanes.request_pause(client(), MAIN, request)
    wait_for(lambda: runtime.threads.interrupts.lane_hinted(MAIN), 5, what="the lane's signal")
    watch = PauseWatch(runtime, job_id=5)
    assert watch.asked() == request
    # The job leaves through a checkpoint, for a decision its history says in words
    leave = watch.hold(request).leave
    assert leave is not None and leave.rt_job == request.rt_job
    assert leave.describe() == f"RT job #10 in this GPU's RT lane {LANE}, which does not fit beside it in GPU memory"
    released = threading.Timer(0.2, lanes.release, args=(client(), MAIN, request.rt_job))
    released.start()
    # When the worker is about to claim, then it waits until the request is gone
    wait_while_lent(runtime, left_for_lane=True)
    assert lanes.pause_request(client(), MAIN) is None
    released.join()
