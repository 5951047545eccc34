"""`clockq` with real GPU worker processes behind the live server: `submit --wait` follows jobs
to their end, `show` gives what they did, and `result` downloads their files only when the
SHA-256 matches."""

from __future__ import annotations

import hashlib
import json

import pytest

from clockq.jobs.results import ResultStore
from tests.harness import wait_for

# Slow: jobs run to their end on real GPU workers behind the CLI (about 80 s); CI's slow pass runs them.
pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SHORT_JOB = "name: short\ntier: HP\nworkload: synthetic\nparams: {steps: 5, step_ms: 1, state_kb: 4}\n"


def test_submit_wait_runs_a_job_and_result_downloads_its_file_checked(clockq, start_workers, tmp_path, settings):
    # Given one GPU worker and a job file
    start_workers(1)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(SHORT_JOB)

    # When alice submits it and waits
    done = clockq("submit", str(job_file), "--wait", "--json", timeout=120)

    # Then it returns once the job has succeeded
    assert done.code == 0, done.err
    (job,) = done.json()
    assert job["state"] == "succeeded" and job["progress"] == 1.0
    job_id = str(job["id"])

    # And `show` gives its slices, its events to the end, and its result's files
    shown = clockq("show", job_id, "--json").json()
    assert len(shown["job"]["slice_history"]) >= 1
    assert shown["job"]["events"][-1]["to_state"] == "succeeded"
    (entry,) = shown["result"]["files"]
    assert entry["name"] == "state.bin"
    table = clockq("show", job_id)
    assert table.code == 0 and "state.bin" in table.out and "succeeded" in table.out

    # And `result` writes every file into the folder given, checked against the manifest's SHA-256
    got = clockq("result", job_id, "-o", str(tmp_path / "out"), "--json")
    assert got.code == 0, got.err
    written = (tmp_path / "out" / "state.bin").read_bytes()
    assert hashlib.sha256(written).hexdigest() == entry["sha256"] == got.json()[0]["sha256"]
    assert len(written) == entry["bytes"]
    # And one file by name, to the path given
    copy = tmp_path / "copy.bin"
    assert clockq("result", job_id, "state.bin", "-o", str(copy)).code == 0
    assert copy.read_bytes() == written
    missing = clockq("result", job_id, "other.bin")
    assert missing.code == 5 and "it has: state.bin" in missing.err

    # When the stored file no longer matches its manifest (one byte flipped on the server's disk)
    stored = ResultStore(settings.CLOCKQ_CHECKPOINT_DIR).folder(job["id"]) / "state.bin"
    stored.chmod(0o644)
    flipped = bytearray(stored.read_bytes())
    flipped[0] ^= 0xFF
    stored.write_bytes(bytes(flipped))
    bad = clockq("result", job_id, "state.bin", "-o", str(copy))

    # Then the download fails with exit 7, and the file already there is left as it was, with
    # no partial file beside it
    assert bad.code == 7 and "SHA-256" in bad.err and "nothing was kept" in bad.err
    assert "Traceback" not in bad.err
    assert copy.read_bytes() == written
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")) == []


def test_submit_wait_exits_6_naming_the_job_that_failed(clockq, start_workers):
    # Given one GPU worker, and a batch of a good job and one that raises at every try
    start_workers(1)
    batch = [
        {"name": "fine", "workload": "synthetic", "params": {"steps": 3, "step_ms": 1}},
        {
            "name": "broken",
            "workload": "synthetic",
            "params": {"steps": 20, "step_ms": 1, "fail_at_step": 3, "fail_times": 1000},
        },
    ]

    # When alice submits it from stdin and waits
    done = clockq("submit", "-", "--tier", "SP", "--wait", stdin=json.dumps(batch), timeout=120)

    # Then it ends once both have, exit 6, saying which failed and why; progress went to stderr
    assert done.code == 6, done.err
    last = done.err.strip().splitlines()[-1]
    assert "1 of 2 did not succeed" in last and "failed" in last and "injected failure at step 3" in last
    assert "(broken): failed" in done.err and "(fine): succeeded" in done.err
    assert "Traceback" not in done.err
    assert "fine" in done.out and "broken" in done.out  # the final table


def test_gpus_lists_the_workers_simulated_gpus(clockq, start_workers):
    start_workers(2)

    def sampled():
        answer = clockq("gpus", "--json").json()
        return answer if len(answer["gpus"]) == 2 else None

    answer = wait_for(sampled, timeout=60, interval=0.5, what="both simulated GPUs to publish a sample")
    assert all(g["simulated"] for g in answer["gpus"])
    workers = clockq("queues", "--json").json()["workers"]
    assert sorted(w["gpu"] for w in workers if w["gpu"] is not None) == [0, 1]
    table = clockq("gpus")
    assert table.code == 0 and "simulated" in table.out
