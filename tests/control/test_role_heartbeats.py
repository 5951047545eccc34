"""Each role's worker announces itself: the control and predictor workers, started with their
roles' real command lines, each put their heartbeat in Redis, without a GPU."""

from __future__ import annotations

import json
import subprocess

import pytest
import redis

from clockq.bus.heartbeat import KEY_PREFIX
from clockq.stack.roles import control_worker_argv, predictor_worker_argv
from tests.harness import ROOT, RedisServer, die_with_parent, stop_process, wait_for

pytestmark = pytest.mark.integration


def test_the_control_and_predictor_workers_each_announce_themselves(tmp_path):
    server = RedisServer(tmp_path / "redis").start()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(ROOT), "REDIS_URL": server.url}
    procs = []
    try:
        with open(tmp_path / "workers.log", "wb") as log:
            for argv in (control_worker_argv(host="hbtest"), predictor_worker_argv(host="hbtest")):
                procs.append(
                    subprocess.Popen(
                        argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
                    )
                )
            r = redis.Redis.from_url(server.url)
            names = ("control@hbtest", "predictor@hbtest")
            wait_for(lambda: all(r.exists(KEY_PREFIX + name) for name in names), 120, what="both heartbeats")
            for name in names:
                info = json.loads(r.get(KEY_PREFIX + name))
                assert info["hostname"] == name and info["gpu"] is None
    finally:
        for proc in procs:
            stop_process(proc, 30)
        server.stop()
