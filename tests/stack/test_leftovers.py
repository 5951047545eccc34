"""What the next start stops (clockq/supervision/records.py; `make run` runs it through
clockq/stack/leftovers.py): only what a dead supervisor's record names, while it is that
process, its user's, and what is left of its process group. Real processes (sleepers); records
written by the supervisor's own writer, with a dead supervisor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clockq.supervision import procs, records
from tests.harness import ROOT, wait_for

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
# A child that leaves a grandchild in its process group, as gunicorn leaves its workers.
WITH_A_GRANDCHILD = ["sh", "-c", "sleep 600 & wait"]
NOBODY = 65534


@pytest.fixture
def started():
    """Start processes in sessions of their own; kill whatever is left of them afterwards."""
    procs_started: list[subprocess.Popen] = []

    def start(argv, **kwargs) -> procs.Identity:
        proc = subprocess.Popen(argv, start_new_session=True, **{"cwd": ROOT, **kwargs})
        procs_started.append(proc)
        who = procs.identity(proc.pid)
        assert who is not None
        return who

    yield start
    for proc in procs_started:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.wait()


def dead_identity() -> procs.Identity:
    """A supervisor that has died: the identity of a process that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    who = procs.identity(proc.pid)
    proc.wait()
    assert who is not None and not procs.is_alive(who)
    return who


def record(var_dir: Path, children: dict[str, procs.Identity], supervisor: procs.Identity | None) -> Path:
    """A record as a supervisor writes it, naming `supervisor` (None: this test process) instead."""
    if supervisor is None:
        return records.write_record(records.record_dir(var_dir), "runstack", children)
    written = records.write_record(var_dir / "scratch", "runstack", children)
    body = json.loads(written.read_text())
    written.unlink()
    body["supervisor"] = [supervisor.pid, supervisor.start]
    path = records.record_dir(var_dir) / f"{supervisor.pid}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))
    return path


def group_of(leader: procs.Identity) -> list[procs.Identity]:
    return [procs.Identity(p.pid, p.start) for p in procs.all_seen() if p.pgrp == leader.pid]


def test_make_runs_first_step_stops_a_dead_supervisors_children_and_their_groups(tmp_path, started):
    # Given a record of a dead supervisor, naming a child that left a grandchild in its group
    var = tmp_path / "var"
    web, beat = started(WITH_A_GRANDCHILD), started(SLEEPER)
    wait_for(lambda: len(group_of(web)) == 2, 10, what="the grandchild to start")
    (grandchild,) = [who for who in group_of(web) if who != web]
    path = record(var, {"web": web, "beat": beat}, supervisor=dead_identity())

    # When make run's first step runs, with the system's python3, as a script
    done = subprocess.run(
        ["python3", "clockq/stack/leftovers.py"],
        cwd=ROOT,
        env={**os.environ, "CLOCKQ_VAR_DIR": str(var)},
        capture_output=True,
        text=True,
        timeout=60,
    )

    # Then all three are gone, it says what it stopped, and the record is removed
    assert done.returncode == 0, done.stderr
    assert not any(map(procs.is_alive, (web, grandchild, beat)))
    assert f"web (pid {web.pid} and 1 more of its group)" in done.stdout
    assert f"beat (pid {beat.pid})" in done.stdout and done.stdout.startswith("clockq: stopped what an earlier")
    assert not path.exists()


def test_nothing_is_touched_that_a_dead_supervisors_record_does_not_name_as_it_is(tmp_path, started):
    var = tmp_path / "var"
    # Given a record that names a pid now someone else's (its start time differs), and a process
    # of another user
    reused = started(SLEEPER)
    as_recorded = procs.Identity(reused.pid, reused.start - 1)
    other_user = started(["/bin/sleep", "600"], user=NOBODY, cwd="/") if os.getuid() == 0 else None
    children = {"web": as_recorded, **({"flower": other_user} if other_user else {})}
    record(var, children, supervisor=dead_identity())
    # And a live supervisor's record, and a dead one's in another checkout
    live_child, elsewhere = started(SLEEPER), started(SLEEPER)
    record(var, {"beat": live_child}, supervisor=None)
    record(tmp_path / "other-checkout", {"beat": elsewhere}, supervisor=dead_identity())
    # And a process of ours in this checkout that no record names
    bystander = started(SLEEPER)

    # When the next start looks for leftovers
    said = records.stop_leftovers(var, grace_s=5)

    # Then every one of them still runs, and nothing was said to be stopped
    assert all(map(procs.is_alive, [reused, live_child, elsewhere, bystander, *([other_user] if other_user else [])]))
    assert said == []


def test_a_file_that_is_not_a_record_is_reported_and_the_start_goes_on(tmp_path, started):
    var = tmp_path / "var"
    records.record_dir(var).mkdir(parents=True)
    (records.record_dir(var) / "123.json").write_text("{not json")
    child = started(SLEEPER)
    record(var, {"beat": child}, supervisor=dead_identity())

    said = records.stop_leftovers(var, grace_s=5)

    assert any("123.json is not a supervisor's record" in line for line in said), said
    assert not procs.is_alive(child)  # the rest is still done
    assert (records.record_dir(var) / "123.json").exists()  # left for a person to judge


def test_a_leftover_that_ignores_sigterm_is_killed_after_the_grace(tmp_path, started):
    var, ready = tmp_path / "var", tmp_path / "ready"
    ignore_then_sleep = (
        f"import signal, time; signal.signal(15, signal.SIG_IGN); open({str(ready)!r}, 'w'); time.sleep(600)"
    )
    stubborn = started([sys.executable, "-c", ignore_then_sleep])
    wait_for(ready.exists, 10, what="the stubborn child to ignore SIGTERM")
    record(var, {"control": stubborn}, supervisor=dead_identity())

    (said,) = records.stop_leftovers(var, grace_s=0.5)

    assert not procs.is_alive(stubborn)
    assert f"killed after 0.5 s: pid {stubborn.pid}" in said
