"""`kill -9` of `make run`'s process group: the roles die with their supervisor, and what could
not (a role that hung) is stopped by the next start, which says so and comes up. Real processes:
the whole `manage.py runstack` (tests/stack/live_stack.py), started twice in one folder; the tests
below are what one such kill and restart shows, and the restarted stack serves a check of its own."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from clockq.supervision import procs
from tests.harness import ROOT, wait_for
from tests.stack.live_stack import ADMIN_PASSWORD, Stack

# slow: a whole `make run` stack started twice (CI's slow pass runs it).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


@dataclass
class KillAndRestart:
    stack: Stack
    started: dict[procs.Identity, str]  # every process the first start had started
    flower: procs.Identity  # the role that hung
    bystander: subprocess.Popen  # ours, working in this checkout, but no part of the stack
    left_after_kill: list[str] = field(default_factory=list)
    flower_outlived_the_kill: bool = False
    restart_failed: str = ""


def named(processes: dict[procs.Identity, str], text: str) -> list[procs.Identity]:
    return [who for who, command in processes.items() if text in command]


@pytest.fixture(scope="module")
def kill_and_restart(tmp_path_factory):
    # Given the whole stack, up, with every process it started
    stack = Stack(tmp_path_factory.mktemp("stack")).start()
    bystander = subprocess.Popen(SLEEPER, cwd=ROOT, start_new_session=True)
    started = stack.processes()
    (flower,) = named(started, "-m clockq.flower")
    undertakers = named(started, "records.py watch")  # runstack's and gpuworkers'
    seen = KillAndRestart(stack, started, flower, bystander)
    try:
        # And Flower hung (stopped: it cannot act on a SIGTERM), and the supervisors' undertakers
        # killed first, as a kill of everything would: nothing of the stack can stop Flower now
        os.kill(flower.pid, signal.SIGSTOP)
        for undertaker in undertakers:
            os.kill(undertaker.pid, signal.SIGKILL)
        wait_for(lambda: not any(map(procs.is_alive, undertakers)), 30, what="the undertakers to be gone")

        # When make run's process group is killed
        os.killpg(stack.service.proc.pid, signal.SIGKILL)
        stack.service.proc.wait()

        # Then (the tests) every other process ends on its own
        def everything_else_gone() -> bool:
            seen.left_after_kill = [
                f"{who.pid} {command}"
                for who, command in started.items()
                if who != flower and who not in undertakers and procs.is_alive(who)
            ]
            return not seen.left_after_kill

        with contextlib.suppress(TimeoutError):  # the list says what is left, for the test to fail on
            wait_for(everything_else_gone, 90, interval=0.2, what="every role to end")
        seen.flower_outlived_the_kill = procs.is_alive(flower)

        # When make run starts again on the same ports, with Flower still holding its own
        try:
            stack.start()
        except (RuntimeError, TimeoutError) as exc:
            seen.restart_failed = str(exc)
        yield seen
    finally:
        bystander.kill()
        bystander.wait()
        stack.stop()
        if (fd := procs.open_pidfd(flower)) is not None:  # a restart that failed left it hung
            procs.send(fd, signal.SIGKILL)
            os.close(fd)
        print(f"--- runstack log (tail) ---\n{stack.output()[-6000:]}")


def test_kill_9_of_make_runs_group_ends_every_role_that_can_act_on_it(kill_and_restart):
    # The kernel's SIGTERM reaches each role (PR_SET_PDEATHSIG), and each stops its own children:
    # gunicorn's workers, gpuworkers' Celery workers, their pools, the embedded Redis.
    assert len(kill_and_restart.started) >= 15, kill_and_restart.started
    assert not kill_and_restart.left_after_kill, "still running after the supervisor's kill -9:\n  " + "\n  ".join(
        kill_and_restart.left_after_kill
    )
    assert kill_and_restart.flower_outlived_the_kill  # it hung, and nothing was left to stop it


def test_the_next_start_stops_what_hung_says_so_comes_up_and_leaves_the_rest_alone(kill_and_restart):
    stack, flower = kill_and_restart.stack, kill_and_restart.flower
    assert not kill_and_restart.restart_failed, kill_and_restart.restart_failed
    assert not procs.is_alive(flower)
    said = stack.output()
    assert "stopped what an earlier runstack" in said and f"flower (pid {flower.pid})" in said
    assert stack.healthy()
    assert kill_and_restart.bystander.poll() is None


def test_the_restarted_stack_never_prints_a_password_and_flower_guards_its_write_api(kill_and_restart):
    stack = kill_and_restart.stack
    assert not kill_and_restart.restart_failed, kill_and_restart.restart_failed
    output = stack.output()  # both starts' and the leftover's notice
    assert ADMIN_PASSWORD not in output and "password in CLOCKQ_ADMIN_PASSWORD" in output
    broker_password = (Path(stack.env["CLOCKQ_VAR_DIR"]) / "redis-password").read_text().strip()
    assert broker_password not in output
    # Flower's write API needs the admin login; /healthcheck is open, as the README says.
    revoke = "/api/task/revoke/00000000-0000-0000-0000-000000000000"
    wait_for(lambda: stack.request("/healthcheck", port=stack.flower)[0] == 200, 60, interval=0.5, what="Flower")
    assert stack.request(revoke, {}, port=stack.flower, headers={"Authorization": ""})[0] == 401
    login = base64.b64encode(f"admin:{ADMIN_PASSWORD}".encode()).decode()
    assert stack.request(revoke, {}, port=stack.flower, headers={"Authorization": f"Basic {login}"})[0] != 401
