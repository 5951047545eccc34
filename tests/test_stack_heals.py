"""`make run`'s stack heals itself: kill -9 of its embedded broker, and every job still
finishes, none twice. Also what it prints and what Flower lets through. Real processes: the
whole `manage.py runstack` on free ports, with its own SQLite and broker in a temporary folder."""

from __future__ import annotations

import base64
import itertools
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest

from tests.harness import ROOT, Service, free_port, wait_for

pytestmark = pytest.mark.integration

ADMIN_PASSWORD = "stack-admin-pass-123"


class Stack:
    def __init__(self, tmp_path):
        self.web, self.flower, self.broker = free_port(), free_port(), free_port()
        self.log_path = tmp_path / "runstack.log"
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
        self.env = {
            **env,
            "CLOCKQ_VAR_DIR": str(tmp_path / "var"),
            "PORT": str(self.web),
            "FLOWER_PORT": str(self.flower),
            "CLOCKQ_EMBEDDED_REDIS_PORT": str(self.broker),
            "CLOCKQ_GPUS": "sim:2",
            "CLOCKQ_ADMIN_PASSWORD": ADMIN_PASSWORD,
            "CLOCKQ_RECONCILE_EVERY_S": "2",
            "CLOCKQ_REDISPATCH_GRACE_S": "2",
        }
        self.token = ""

    def start(self) -> Stack:
        self.service = Service("runstack", [sys.executable, "manage.py", "runstack"], self.env, ROOT, self.log_path)
        self.service.start()
        wait_for(lambda: self.alive() and self.healthy(), 120, interval=0.5, what="the stack to answer /healthz 200")
        made = subprocess.run(
            [sys.executable, "manage.py", "createtoken", "admin"], cwd=ROOT, env=self.env, capture_output=True
        )
        self.token = made.stdout.decode().strip()
        return self

    def alive(self) -> bool:
        self.service.check_alive()
        return True

    def output(self) -> str:
        return self.service.log_text()

    def request(self, path: str, body: dict | None = None, port: int | None = None, headers: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{port or self.web}{path}",
            data=data,
            headers={"Authorization": f"Token {self.token}", "Content-Type": "application/json", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                raw = response.read()
                is_json = response.headers.get_content_type() == "application/json"
                return response.status, json.loads(raw) if is_json else raw.decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, None

    def healthy(self) -> bool:
        try:
            return self.request("/healthz")[0] == 200
        except OSError:
            return False

    def broker_pid(self) -> int | None:
        found = subprocess.run(["pgrep", "-f", f"redis-server 127.0.0.1:{self.broker}"], capture_output=True, text=True)
        pids = found.stdout.split()
        return int(pids[0]) if pids else None

    def stop(self) -> None:
        self.service.stop(grace_s=90)


@pytest.fixture
def stack(tmp_path):
    running = Stack(tmp_path)
    try:
        yield running.start()
    finally:
        running.stop()
        print(f"--- runstack log (tail) ---\n{running.output()[-6000:]}")


def submit(stack: Stack, name: str) -> int:
    status, body = stack.request(
        "/api/jobs", {"name": name, "tier": "SP", "workload": "synthetic", "params": {"steps": 60, "step_ms": 10}}
    )
    assert status == 201, status
    return body["id"]


def test_kill_9_of_the_broker_restarts_it_and_every_job_finishes_once(stack):
    # Given jobs running and waiting
    ids = [submit(stack, f"before-{i}") for i in range(6)]
    first = stack.broker_pid()
    assert first

    # When the broker is killed
    os.kill(first, signal.SIGKILL)

    # Then the stack starts it again, its clients reconnect, and /healthz is 200 again
    wait_for(lambda: (stack.broker_pid() or first) != first, 30, interval=0.2, what="a new broker process")
    wait_for(lambda: stack.alive() and stack.healthy(), 60, interval=0.5, what="/healthz 200 again")
    ids += [submit(stack, f"after-{i}") for i in range(2)]

    # And every job finishes, none running twice
    def finished():
        return all(stack.request(f"/api/jobs/{i}")[1]["state"] == "succeeded" for i in ids)

    wait_for(finished, 120, interval=1.0, what="every job to finish")
    for job_id in ids:
        _status, job = stack.request(f"/api/jobs/{job_id}?history=1")
        slices = sorted(job["slice_history"], key=lambda s: s["started_at"])
        for earlier, later in itertools.pairwise(slices):
            assert datetime.fromisoformat(earlier["ended_at"]) <= datetime.fromisoformat(later["started_at"])
    assert "exited" in stack.output() and "restarting" in stack.output()


def test_the_stack_never_prints_a_password_and_flower_guards_its_write_api(stack):
    output = stack.output()
    assert ADMIN_PASSWORD not in output and "password in CLOCKQ_ADMIN_PASSWORD" in output
    broker_password = (Path(stack.env["CLOCKQ_VAR_DIR"]) / "redis-password").read_text().strip()
    assert broker_password not in output
    # Flower's write API needs the admin login; /healthcheck is open, as the README says.
    revoke = "/api/task/revoke/00000000-0000-0000-0000-000000000000"
    wait_for(lambda: stack.request("/healthcheck", port=stack.flower)[0] == 200, 60, interval=0.5, what="Flower")
    assert stack.request(revoke, {}, port=stack.flower, headers={"Authorization": ""})[0] == 401
    login = base64.b64encode(f"admin:{ADMIN_PASSWORD}".encode()).decode()
    assert stack.request(revoke, {}, port=stack.flower, headers={"Authorization": f"Basic {login}"})[0] != 401
