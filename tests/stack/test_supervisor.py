"""The supervisor's stop order: the other children first, then what must still reach the broker
(`before_last`: runstack gives up its worker names there), then the broker itself. And nothing
it started outlives it: its children get SIGTERM from the kernel when it dies, and its undertaker
kills what is left after the grace. Real processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from clockq.supervision import procs, records
from clockq.supervision.supervisor import Child, Supervisor
from tests.harness import ROOT, wait_for

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def test_before_last_runs_once_the_others_stopped_and_while_the_broker_still_runs():
    worker, broker = Child("worker", SLEEPER), Child("broker", SLEEPER, stop_last=True)
    seen: list[tuple[int | None, int | None]] = []
    supervisor = Supervisor(
        [broker, worker], stop_grace_s=10, before_last=lambda: seen.append((worker.proc.poll(), broker.proc.poll()))
    )
    supervisor.start_all()
    try:
        assert worker.proc.poll() is None and broker.proc.poll() is None
    finally:
        supervisor.stop_all()

    ((worker_code, broker_code),) = seen
    assert worker_code is not None  # the worker had stopped
    assert broker_code is None  # the broker still ran
    assert broker.proc.poll() is not None  # and is stopped at the end


def test_a_failing_before_last_still_stops_the_broker():
    broker = Child("broker", SLEEPER, stop_last=True)

    def fails():
        raise RuntimeError("the broker refused")

    supervisor = Supervisor([broker], stop_grace_s=10, before_last=fails)
    supervisor.start_all()
    supervisor.stop_all()
    assert broker.proc.poll() is not None


# A supervisor of its own, in a process a test can kill -9: its children are the argv lists
# given as JSON, its record folder (or none) and grace after them.
SUPERVISE = """
import json, sys
from pathlib import Path
from clockq.supervision.supervisor import Child, Supervisor
argvs, record_dir, grace = json.loads(sys.argv[1]), sys.argv[2], float(sys.argv[3])
children = [Child(f"child{i}", argv) for i, argv in enumerate(argvs)]
Supervisor(children, stop_grace_s=grace, record_dir=Path(record_dir) if record_dir else None).run_forever()
"""


def supervise(argvs: list[list[str]], record_dir: Path | None = None, grace_s: float = 10) -> subprocess.Popen:
    argv = [sys.executable, "-c", SUPERVISE, json.dumps(argvs), str(record_dir or ""), str(grace_s)]
    return subprocess.Popen(argv, cwd=ROOT, start_new_session=True)


def descendants(pid: int) -> list[procs.Identity]:
    everyone = procs.all_seen()
    found, parents = [], {pid}
    while new := [p for p in everyone if p.ppid in parents and p.pid not in parents]:
        found += [procs.Identity(p.pid, p.start) for p in new]
        parents |= {p.pid for p in new}
    return found


def test_every_child_dies_with_its_supervisor_even_by_sigkill():
    # Given a supervisor with no record (no undertaker): the kernel's signal alone
    supervisor = supervise([SLEEPER, SLEEPER])
    try:
        children = wait_for(lambda: len(found := descendants(supervisor.pid)) == 2 and found, 30, what="two children")

        # When it is killed with SIGKILL
        supervisor.kill()
        supervisor.wait()

        # Then its children end too
        wait_for(lambda: not any(map(procs.is_alive, children)), 30, what=f"the children {children} to end")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(supervisor.pid, signal.SIGKILL)


def test_its_undertaker_kills_a_child_that_ignores_sigterm_and_what_another_left_in_its_group(tmp_path):
    # Given a supervisor with a record: a child that ignores SIGTERM, and one with a grandchild
    ready = tmp_path / "ready"
    stubborn = f"import signal, time; signal.signal(15, signal.SIG_IGN); open({str(ready)!r}, 'w'); time.sleep(600)"
    record_dir = tmp_path / "stack"
    supervisor = supervise([[sys.executable, "-c", stubborn], ["sh", "-c", "sleep 600 & wait"]], record_dir, grace_s=1)
    try:
        wait_for(ready.exists, 30, what="the stubborn child to ignore SIGTERM")
        everyone = wait_for(lambda: len(found := descendants(supervisor.pid)) == 4 and found, 30, what="them all")
        (record,) = record_dir.glob("*.json")

        # When the supervisor is killed with SIGKILL
        supervisor.kill()
        supervisor.wait()

        # Then its undertaker ends them all (the stubborn one after the grace), and removes the record
        wait_for(lambda: not any(map(procs.is_alive, everyone)), 30, what=f"{everyone} to end")
        wait_for(lambda: not record.exists(), 10, what="the record to be removed")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(supervisor.pid, signal.SIGKILL)


def test_a_clean_stop_removes_the_record_and_ends_the_undertaker(tmp_path):
    child = Child("worker", SLEEPER)
    supervisor = Supervisor([child], stop_grace_s=10, name="gpuworkers", record_dir=tmp_path)
    supervisor.start_all()
    try:
        record = records.read_record(supervisor.record_path)
        assert record.name == "gpuworkers" and record.children == {"worker": procs.identity(child.proc.pid)}
    finally:
        supervisor.stop_all()
    assert not supervisor.record_path.exists()
    assert supervisor.undertaker.returncode == 0


def test_a_supervisor_refuses_to_start_a_child_from_another_thread():
    supervisor = Supervisor([Child("worker", SLEEPER)])
    failed: list[BaseException] = []

    def start() -> None:
        try:
            supervisor.start_all()
        except RuntimeError as exc:
            failed.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    assert "from the main thread" in str(failed[0])
    assert supervisor.children[0].proc is None
