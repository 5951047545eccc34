"""bench/control_plane.py, run small so that it does not rot: its own PostgreSQL and Redis, two
and eight simulated GPUs for a few seconds each at the cadence, and the eight again with their
timers stretched (a cost phase), from two driver processes. The figures must be sane, not fast:
no time is judged here."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent

pytestmark = [
    pytest.mark.skipif(
        shutil.which("initdb") is None or shutil.which("pg_ctl") is None,
        reason="the bench makes its own PostgreSQL cluster: needs initdb and pg_ctl on PATH",
    ),
    pytest.mark.slow,  # a PostgreSQL cluster and two sizes measured (about 25 s; CI's slow pass runs it)
]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("control-plane") / "result.json"
    argv = [sys.executable, "bench/control_plane.py", "--gpus", "2", "8", "--warmup-s", "1", "--measure-s", "3"]
    # Two driver processes, as a bigger machine runs more: their figures are added up.
    argv += ["--cost-rate", "8", "--min-claims", "0", "--procs", "2", "--threads", "4", "--json", str(out)]
    # The timeout only keeps a hung bench from hanging the suite; no figure depends on time.
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


def test_it_runs_each_size_at_the_cadence_then_the_larger_one_stretched(run):
    result, _ = run
    phases = [(p["kind"], p["gpus"]) for p in result["phases"]]
    assert phases == [("cadence", 2), ("cadence", 8), ("cost", 8)]
    cost = result["phases"][2]
    assert cost["slice_s"] == pytest.approx(1.0)  # 8 GPUs offer 8 boundaries/s, as --cost-rate asked
    assert all(p["driver_processes"] == 2 for p in result["phases"])


def test_every_phase_switches_jobs_through_real_claims_and_boundaries_without_errors(run):
    result, _ = run
    for p in result["phases"]:
        assert p["errors"] == {}, p["first_errors"]
        assert "lost ownership" not in p["counts"]
        assert p["boundaries_per_s"] > 0 and p["claims_per_s"] > 0
        # Every boundary yields (the default switch share), and no more boundaries than offered.
        assert p["yields_per_s"] == pytest.approx(p["boundaries_per_s"])
        assert p["boundaries_per_s"] <= 1.5 * p["offered_per_s"]


def test_latencies_are_positive_and_ordered(run):
    result, _ = run
    for p in result["phases"]:
        for name in ("claim", "read", "yield", "boundary", "fetch", "lag"):
            lat = p["latency_ms"][name]
            assert lat["n"] > 0, name
            assert 0 <= lat["p50"] <= lat["p99"] <= lat["max"] and math.isfinite(lat["max"]), (name, lat)


def test_the_servers_work_is_counted_per_boundary(run):
    result, _ = run
    for p in result["phases"]:
        b = p["per_boundary"]
        # A switch is some twenty statements (the claim's and the boundary's reads, the writes)
        # and some forty Redis commands (clockq's and Celery's).
        assert 5 < b["sql_statements"] < 200, b
        assert 5 < b["redis_commands"] < 500, b
        assert b["sql_exec_ms"] > 0 and b["redis_usec"] > 0
        cpu = p["cpu_cores"]
        assert all(cpu[k] >= 0 for k in ("drivers", "postgres", "redis", "machine_busy")), cpu
        assert p["postgres_top"] and p["redis_top"]


def test_it_prints_the_tables_and_the_freed_set_reads(run):
    result, stdout = run
    assert "| GPUs | boundaries/s (offered) |" in stdout
    assert "2,000 boundaries/s would take" in stdout
    assert [row["members"] for row in result["freed_view"]] == [2, 8]
    assert all(row["seen"] == row["members"] for row in result["freed_view"])
