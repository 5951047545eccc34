"""`manage.py gpuworkers`: one pinned worker per GPU, restarted when it dies."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from clockq.bus.client import client
from clockq.stack.roles import gpu_worker_argv
from tests.harness import ROOT, wait_for
from workers.gpus import Gpu, gpu_worker_env

pytestmark = pytest.mark.integration


def _heartbeat(gpu: int) -> dict | None:
    raw = client().get(f"clockq:worker:gpu{gpu}@{socket.gethostname()}")
    return json.loads(raw) if raw else None


def test_one_pinned_worker_per_gpu_consuming_the_tiers_in_order():
    argv = gpu_worker_argv(3, host="node7")
    assert argv[argv.index("--hostname") + 1] == "gpu3@node7"
    assert argv[argv.index("--queues") + 1] == "rt,hp,sp,bp,bk"
    assert argv[argv.index("--concurrency") + 1] == "1"
    env = gpu_worker_env(Gpu(3, "simulated GPU", 81920, True))
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["CLOCKQ_GPU_INDEX"] == "3"
    assert env["CLOCKQ_GPU_MEMORY_MIB"] == "81920" and env["CLOCKQ_GPU_SIMULATED"] == "1"


def test_a_worker_killed_with_sigkill_is_restarted(start_workers):
    workers = start_workers(gpus=2)
    victim = _heartbeat(1)["pid"]
    bystander = _heartbeat(0)["pid"]
    assert victim in workers.worker_pids()

    os.kill(victim, signal.SIGKILL)

    restarted = wait_for(lambda: (hb := _heartbeat(1)) and hb["pid"] != victim and hb, 30, what="a new gpu1 worker")
    assert restarted["gpu"] == 1
    assert restarted["pid"] in workers.worker_pids()
    assert _heartbeat(0)["pid"] == bystander  # the other GPU's worker was left alone


def test_a_second_host_with_the_same_name_refuses_to_start_while_the_first_is_live(start_workers, tmp_path):
    # Given a host "twin" whose GPU worker is live
    first = start_workers(gpus=1, CLOCKQ_HOST="twin")

    # When another host calls itself "twin" too
    second = subprocess.run(
        [sys.executable, "manage.py", "gpuworkers"],
        cwd=ROOT,
        env={**first.env, "CLOCKQ_HOST": "twin"},
        capture_output=True,
        text=True,
        timeout=120,
    )

    # Then it refuses to start, saying who holds the name, and the first keeps running
    assert second.returncode != 0
    assert "gpu0@twin is held by a live worker" in second.stderr and "CLOCKQ_HOST" in second.stderr
    first.check_alive()
    assert _heartbeat_of("gpu0@twin")["pid"] in first.worker_pids()


def _heartbeat_of(name: str) -> dict:
    return json.loads(client().get(f"clockq:worker:{name}"))
