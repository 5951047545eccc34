"""The `command` workload: an external program driven through the checkpoint protocol."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from clockq.jobs import workloads
from clockq.jobs.checkpoints import CheckpointStore
from tests.harness import needs_sandbox, processes_of, program_python, shared_copy, wait_for
from workers.workloads import command
from workers.workloads.base import RunContext, StartAbandoned
from workers.workloads.command import CommandWorkload, catches_signal

FIXTURE = Path(__file__).parent / "fixtures" / "count_script.py"
PY = program_python()


@pytest.fixture
def work(settings):
    """Job 7's work folder, where the checkpoint store puts it (programs may run sandboxed)."""
    return CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR).work_dir(7)


@pytest.fixture
def script(crossable_dir):
    return shared_copy(FIXTURE, crossable_dir)


def make(work_dir: Path, argv: list[str], step_ms: float = 5.0) -> CommandWorkload:
    w = CommandWorkload(workloads.validate("command", {"argv": argv, "step_ms": step_ms}, may_run_commands=True))
    w.setup(RunContext(job_id=7, gpu_index=0, work_dir=work_dir))
    return w


def count_argv(script: str, n: int, *extra: str) -> list[str]:
    return [PY, script, str(n), "--sleep-ms", "5", *extra]


def step_until(w: CommandWorkload, progress: float, timeout: float = 5.0) -> float:
    deadline = time.monotonic() + timeout
    while (p := w.step()) < progress:
        assert time.monotonic() < deadline, f"stuck at progress {p}"
    return p


def test_checkpoint_close_and_resume_in_a_new_instance(work, script):
    w = make(work, count_argv(script, 40))
    p = step_until(w, 0.2)
    assert 0.2 <= p <= 0.999
    state = w.state_dict()
    w.close()
    saved = int(state.decode())
    assert 0 < saved < 40

    w2 = make(work, count_argv(script, 40))
    w2.load_state_dict(state)
    assert step_until(w2, 1.0) == 1.0
    w2.close()

    assert (work / "result" / "count.txt").read_text() == "count=40"
    starts = [line for line in (work / "stdout.log").read_text().splitlines() if line.startswith("start")]
    assert starts == ["start resume=0 count=0 env_resume=", f"start resume=1 count={saved} env_resume=1"]


def test_checkpoint_then_keep_running_restarts_with_resume(work, script):
    w = make(work, count_argv(script, 30))
    step_until(w, 0.1)
    saved = int(w.state_dict().decode())
    assert w.pid is None  # stopped by the checkpoint
    assert step_until(w, 1.0) == 1.0
    w.close()
    assert (work / "result" / "count.txt").read_text() == "count=30"
    assert f"start resume=1 count={saved} env_resume=1" in (work / "stdout.log").read_text()


def test_nonzero_exit_raises_with_stderr(work, script):
    w = make(work, count_argv(script, 40, "--fail-at", "3"))
    with pytest.raises(RuntimeError, match=r"exited with code 3(.|\n)*simulated failure at count 3"):
        step_until(w, 1.0)
    w.close()


def test_death_by_signal_raises(work):
    w = make(work, ["sh", "-c", "echo dying >&2; kill -9 $$"])
    with pytest.raises(RuntimeError, match=r"SIGKILL(.|\n)*dying"):
        step_until(w, 1.0)
    w.close()


def test_exit_75_without_a_checkpoint_raises(work):
    code = (
        "import pathlib, signal, sys, time; signal.signal(signal.SIGUSR1, lambda *a: sys.exit(75)); "
        "pathlib.Path('handler-ready').touch(); time.sleep(30)"
    )
    w = make(work, [PY, "-c", code])
    w.step()
    wait_for(lambda: (work / "handler-ready").exists(), 10, interval=0.01, what="the handler to be installed")
    with pytest.raises(RuntimeError, match="without writing checkpoint"):
        w.state_dict()
    w.close()


def test_the_start_waits_for_the_handler_so_a_slow_starter_is_not_killed_by_its_first_checkpoint(work):
    # It takes 0.3 s to install its handler, longer than a slice's first step.
    code = (
        "import os, signal, sys, time; time.sleep(0.3)\n"
        "def on_usr1(*a):\n"
        "    open(os.environ['CLOCKQ_CHECKPOINT_FILE'], 'w').write('7'); sys.exit(75)\n"
        "signal.signal(signal.SIGUSR1, on_usr1); time.sleep(30)"
    )
    w = make(work, [PY, "-c", code])
    w.ready()
    assert catches_signal(w.pid, signal.SIGUSR1)
    assert w.state_dict() == b"7"
    w.close()


def test_a_start_abandoned_for_an_rt_job_kills_the_program_and_can_start_again(work):
    # Its handler comes only once the test has made the file 'go'.
    code = (
        "import os, signal, sys, time\n"
        "while not os.path.exists('go'): time.sleep(0.01)\n"
        "def on_usr1(*a):\n"
        "    open(os.environ['CLOCKQ_CHECKPOINT_FILE'], 'w').write('7'); sys.exit(75)\n"
        "signal.signal(signal.SIGUSR1, on_usr1); time.sleep(30)"
    )
    w = make(work, [PY, "-c", code])
    asked = []
    with pytest.raises(StartAbandoned):  # without the handler, which cannot have come yet
        w.ready(abandon=lambda: asked.append(1) or len(asked) > 3)
    assert len(asked) == 4
    assert w.pid is None  # killed, not left running
    (work / "go").touch()
    w.ready()  # the next claim starts it afresh
    assert w.state_dict() == b"7"
    w.close()


def test_catches_signal_reads_the_kernels_mask():
    before = signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    try:
        assert catches_signal(os.getpid(), signal.SIGUSR2) is False
        signal.signal(signal.SIGUSR2, lambda *a: None)
        assert catches_signal(os.getpid(), signal.SIGUSR2) is True
    finally:
        signal.signal(signal.SIGUSR2, before)
    assert catches_signal(2**22 + 12345, signal.SIGUSR1) is None  # no such process


def test_signal_before_the_handler_is_in_place_keeps_the_old_state(work, monkeypatch):
    monkeypatch.setattr(command, "HANDLER_WAIT_S", 0.05)  # it never installs one
    w = make(work, ["sleep", "30"])  # sleep dies on SIGUSR1, like a program still starting up
    w.step()
    assert w.state_dict() == b""  # fresh start: nothing to resume from
    assert w.pid is None and not w.resume
    w.close()


@needs_sandbox()
def test_close_kills_every_process_the_program_started(work, monkeypatch):
    monkeypatch.setattr(command, "HANDLER_WAIT_S", 0.05)  # sleep installs no handler
    # A child in the program's group, and a grandchild in a session of its own.
    w = make(work, ["sh", "-c", "sleep 30 & setsid sh -c 'sleep 30' & touch started; exec sleep 30"])
    assert w.step() == 0.0
    wait_for(lambda: (work / "started").exists(), timeout=10, what="the program's start")
    uid = w.folder.owner
    wait_for(lambda: len(processes_of(uid)) >= 4, timeout=10, what="its processes")  # bwrap's two, sleep's three

    w.close()

    assert w.pid is None
    assert processes_of(uid) == []  # close() returns once the sandbox's namespace is empty


def test_state_before_any_step_round_trips(work, script):
    (work / "checkpoint").write_text("stale")  # left by an earlier run; not this job's state
    w = make(work, count_argv(script, 10))
    assert w.state_dict() == b""
    w.load_state_dict(b"4")
    assert w.state_dict() == b"4"
    assert step_until(w, 1.0) == 1.0
    w.close()
    assert "start resume=1 count=4 env_resume=1" in (work / "stdout.log").read_text()
    assert (work / "result" / "count.txt").read_text() == "count=10"
