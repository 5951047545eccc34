"""python manage.py replay: tables, JSON and plots from a trace; a clear error for bad input.

The traces written here are generated; the Tiresias one is an excerpt of the real trace (the
first 40 jobs, tests/replay/fixtures/README.md)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from clockq.policy.ordering import DEFAULT_LADDER

TIRESIAS = Path(__file__).resolve().parent / "fixtures" / "tiresias_first_40.csv"


def replay(*args: str) -> str:
    out = io.StringIO()
    call_command("replay", *args, "--quiet", stdout=out, stderr=io.StringIO())
    return out.getvalue()


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return str(path)


def test_the_four_policies_side_by_side_on_a_real_trace():
    out = replay(str(TIRESIAS), "--format", "tiresias", "--gpus", "16")
    header = next(line for line in out.splitlines() if line.startswith("metric"))
    assert header.split() == ["metric", "fifo", "priority", "las", "clockq"]
    for row in ("mean wait", "p95 wait", "HP mean wait", "GPU utilisation", "timeout rate", "on-time rate", "mean JCT"):
        assert any(line.startswith(row) for line in out.splitlines()), row
    assert "tier by gpu_time" in out  # the mapping is stated with the table


def test_json_for_machines(tmp_path):
    out = replay(str(TIRESIAS), "--format", "tiresias", "--gpus", "16", "--policy", "fifo,clockq", "--json")
    data = json.loads(out)
    assert [p["policy"] for p in data["policies"]] == ["fifo", "clockq"]
    assert data["trace"]["jobs"] == 40
    fifo, clockq = data["policies"]
    assert fifo["jobs"] == clockq["jobs"] == 40
    assert 0 < clockq["gpu_utilisation"] <= 1


def test_the_service_ladder_on_request(tmp_path):
    # Two BK jobs of 1,000 s on one GPU: on the default ladder (first rung 300 GPU-s) A makes way
    # for B at 300 s; on a ladder of 100 GPU-s, at 100 s.
    path = write(tmp_path, "submit_time,duration,num_gpu,tier,job_id\n0,1000,1,BK,A\n0,1000,1,BK,B\n")
    args = (path, "--format", "csv", "--gpus", "1", "--policy", "clockq", "--json")
    default, short = json.loads(replay(*args)), json.loads(replay(*args, "--ladder", "100,8000"))
    default_rungs = ",".join(f"{r:g}" for r in DEFAULT_LADDER.base_gpu_s)
    assert (default["trace"]["ladder_gpu_s"], short["trace"]["ladder_gpu_s"]) == (default_rungs, "100,8000")
    waits = [run["policies"][0]["wait_mean_s"] for run in (default, short)]
    assert waits == pytest.approx([150.0, 50.0], abs=1.0)  # B's wait, halved: (0 + 300) / 2, (0 + 100) / 2
    assert "service ladder: 100,8000 GPU-seconds" in replay(*args[:-1], "--ladder", "100,8000")


def test_admission_control_on_request(tmp_path):
    # Two GPUs busy for 10 minutes: admission closes at the first forecast. By default it holds
    # nothing here (the SP job has no work ahead of it); holding all holds the SP job.
    rows = ["job_id,submit_time,duration,num_gpu,tier"]
    rows += ["a,0,600,1,BK", "b,1,600,1,BK", "c,70,10,1,SP"]
    path = write(tmp_path, "\n".join(rows) + "\n")
    args = (path, "--format", "csv", "--gpus", "2", "--policy", "clockq", "--slack", "1000", "--json")
    when_full = json.loads(replay(*args, "--admission"))["policies"][0]
    held = json.loads(replay(*args, "--admission", "all"))["policies"][0]
    plain = json.loads(replay(*args))["policies"][0]
    assert (when_full["held_jobs"], when_full["admission_closures"]) == (0, 1)
    assert (held["held_jobs"], held["admission_closures"]) == (1, 1)
    assert (plain["held_jobs"], plain["admission_closures"]) == (0, 0)
    assert when_full["tiers"]["SP"]["wait_mean_s"] == plain["tiers"]["SP"]["wait_mean_s"]
    assert held["tiers"]["SP"]["wait_mean_s"] > plain["tiers"]["SP"]["wait_mean_s"]


def test_plots_the_wait_cdfs(tmp_path):
    target = tmp_path / "waits.html"
    replay(str(TIRESIAS), "--format", "tiresias", "--gpus", "16", "--policy", "fifo,clockq", "--plot", str(target))
    assert target.stat().st_size > 10_000


@pytest.mark.parametrize(
    ("text", "args", "message"),
    [
        ("submit_time,duration,num_gpu\n0,10,1\n", (), "line 1, column 'tier'"),
        ("submit_time,duration,num_gpu,tier\n0,10,1,SP\n-5,10,1,SP\n", (), "line 3, column 'submit_time'"),
        ("submit_time,duration,num_gpu,tier\n5,10,1,SP\n1,10,1,SP\n", (), "line 3, column 'submit_time'"),
        ("submit_time,duration,num_gpu,tier\n0,10,1,XX\n", (), "line 2, column 'tier'"),
        ("submit_time,duration,num_gpu,tier\n0,ten,1,SP\n", (), "line 2, column 'duration'"),
        ("submit_time,duration,num_gpu,tier\n0,10,1,SP\n1,10,4,HP\n", (), "line 3, column 'num_gpu'"),
    ],
)
def test_a_bad_trace_is_refused_naming_the_line_and_column(tmp_path, text, args, message):
    path = write(tmp_path, text)
    with pytest.raises(CommandError, match=message):
        replay(path, "--format", "csv", "--gpus", "2", *args)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--gpus", "0"), "--gpus"),
        (("--gpus", "2", "--policy", "fifo,sjf"), "unknown sjf"),
        (("--gpus", "2", "--time-scale", "-1"), "must be a positive number"),
        (("--gpus", "2", "--plot", "out.pdf"), ".html or .png"),
        (("--gpus", "2", "--switch-cost-factor", "nan"), "--switch-cost-factor: 'nan' must be a finite number"),
        (("--gpus", "2", "--slack", "-1"), "--slack: '-1' must be a finite number of at least 0"),
        (("--gpus", "2", "--checkpoint-mb", "big"), "--checkpoint-mb: 'big' is not a number"),
        (("--gpus", "2", "--until", "soon"), "--until: 'soon' is not a number"),
        (("--gpus", "2", "--ladder", "300,x"), "--ladder: '300,x' is not a comma-separated list"),
        (("--gpus", "2", "--ladder", "2400,300"), "--ladder: .* strictly increasing"),
    ],
)
def test_bad_options_are_refused(tmp_path, args, message):
    path = write(tmp_path, "submit_time,duration,num_gpu,tier\n0,10,1,SP\n")
    with pytest.raises(CommandError, match=message):
        replay(path, "--format", "csv", *args)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(CommandError, match=r"nothing\.csv"):
        replay(str(tmp_path / "nothing.csv"), "--format", "csv", "--gpus", "2")


def test_a_live_replay_is_pointed_to_the_bench_script(tmp_path):
    path = write(tmp_path, "submit_time,duration,num_gpu,tier\n0,10,1,SP\n")
    with pytest.raises(CommandError, match=r"--live, --compress: live replays moved to bench/replay_live\.py"):
        replay(path, "--format", "csv", "--gpus", "2", "--live", "http://127.0.0.1:8000", "--compress", "25")
