"""An existing script, brought through the `command` workload, is time-sliced on a real worker."""

from __future__ import annotations

import pytest
from django.conf import settings

from clockq.jobs.checkpoints import CheckpointStore
from tests.harness import ROOT, program_python, shared_copy
from tests.helpers import submit, wait_finished

pytestmark = pytest.mark.integration

FIXTURE = ROOT / "tests/workloads/fixtures/count_script.py"


def test_a_command_job_checkpoints_on_sigusr1_and_resumes_when_it_shares_a_gpu(start_workers, operator, crossable_dir):
    # The overhead rule would stretch the script's slices (a process restart is a costly
    # switch); turn it off here so that it is preempted many times.
    start_workers(gpus=1, CLOCKQ_OVERHEAD_BUDGET="0")
    argv = [program_python(), shared_copy(FIXTURE, crossable_dir), "150", "--sleep-ms", "4"]
    script = submit(operator, "SP", "script", workload="command", argv=argv, step_ms=10)
    rival = submit(operator, "SP", "rival", steps=60, step_ms=10)

    script, rival = wait_finished(script, rival, timeout=90)

    assert script.state == "succeeded", script.last_error
    assert rival.state == "succeeded"
    # It made way for its rival at slice ends: SIGUSR1, checkpoint, exit 75, resume later.
    assert script.slices.filter(outcome="yielded").count() >= 2
    work = CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR).work_dir(script.pk)
    assert (work / "result" / "count.txt").read_text() == "count=150"
    assert [(f["name"], f["bytes"]) for f in script.result_files] == [("count.txt", 9)]  # kept as its result
    from clockq.jobs.metrics import curves

    remaining = curves(script.pk)["remaining"]["points"]  # from CLOCKQ_METRICS_FILE, each step once
    assert [step for step, _ in remaining] == list(range(1, 151)) and remaining[-1] == [150, 0.0]
    starts = (work / "stdout.log").read_text().splitlines()
    assert starts[0].startswith("start resume=0 count=0")
    assert any(line.startswith("start resume=1") for line in starts[1:]), starts
