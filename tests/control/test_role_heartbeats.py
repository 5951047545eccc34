"""Each role's worker announces itself: the control and predictor workers, started with their
roles' real command lines, each put their heartbeat in Redis, without a GPU, with the service
ladder the process runs (a client tells from it which order a cluster runs: bench/replay_live.py)."""

from __future__ import annotations

import json

import pytest
import redis

from clockq.bus.heartbeat import KEY_PREFIX
from clockq.stack.roles import control_worker_argv, predictor_worker_argv
from tests.harness import ROOT, RedisServer, Service, wait_for

pytestmark = pytest.mark.integration


def test_the_control_and_predictor_workers_each_announce_themselves(tmp_path):
    server = RedisServer(tmp_path / "redis").start()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(ROOT), "REDIS_URL": server.url, "CLOCKQ_SERVICE_LADDER_S": "1,8"}
    log_path = tmp_path / "workers.log"
    workers = [
        Service("control worker", control_worker_argv(host="hbtest"), env, ROOT, log_path),
        Service("predictor worker", predictor_worker_argv(host="hbtest"), env, ROOT, log_path),
    ]
    try:
        for worker in workers:
            worker.start()
        r = redis.Redis.from_url(server.url)
        names = ("control@hbtest", "predictor@hbtest")

        def both_beat():
            for worker in workers:
                worker.check_alive()
            return all(r.exists(KEY_PREFIX + name) for name in names)

        wait_for(both_beat, 120, what="both heartbeats")
        for name in names:
            info = json.loads(r.get(KEY_PREFIX + name))
            assert info["hostname"] == name and info["gpu"] is None
            assert info["service_ladder_s"] == [1.0, 8.0]
    finally:
        for worker in workers:
            worker.stop(grace_s=30)
        server.stop()
