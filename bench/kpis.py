"""Benchmark: GET /api/kpis and GET /metrics with 100,000 jobs and 1,000,000 slices in
the database, on SQLite and on PostgreSQL, each against a bare `SELECT count(*)` on the slice
table in the same run. Goal: every endpoint under 300 ms at p95.

    .venv/bin/python bench/kpis.py                        # both databases, full size
    .venv/bin/python bench/kpis.py --db sqlite --jobs 10000 --slices 100000   # a quick look

Per database, in a private clockq (bench/_harness.py: its own directory, redis-server and,
for PostgreSQL, a throwaway cluster made with initdb as .ci/run does, bench/_databases.py):

1. One day of history on 8 GPUs, ending now (bench/_history.py): every GPU runs slices back
   to back (10 per job, about 0.65 s each), jobs in five tiers with waits, deadlines, late
   marks, failures, lost slices and cancellations; an event per job and per slice, and a promotion for 1 SP job in
   100. Written with executemany (SQLite) or COPY (PostgreSQL), then ANALYZE, as autovacuum would.
2. The KPI rollup: the first run (it backfills the whole day) and a steady run after it (the
   trailing minutes only, as every 60 s in production), each timed.
3. gunicorn as `make run` starts it (2 workers x 4 threads); then rounds of requests, one at a
   time: GET /api/kpis (default window: the last hour), /api/kpis for the last day, /metrics
   (with its bearer token; timed only if it answers 200), and in this process the bare
   `SELECT count(*) FROM jobs_slice`. Medians, p95 and each one's ratio to the count(*).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import _harness as h
import requests
from _databases import database_name, postgres_cluster, run_per_database
from _history import DAY, GPUS, analyze, extend_hours, write_history

LONG_DAYS = 365  # the longest window /api/kpis takes is 366 days
P95_GOAL_MS = 300.0


# --- timing ---------------------------------------------------------------------------------------


def p95(values: list[float]) -> float:
    return h.percentile(sorted(values), 95)


def time_everything(url: str, api_token: str, metrics_token: str, rounds: int) -> dict[str, dict]:
    from django.db import connection

    session = requests.Session()
    api = {"Authorization": f"Token {api_token}"}
    day_ago = (datetime.now(UTC) - DAY).isoformat()

    def days_ago(n: int) -> str:
        return (datetime.now(UTC) - n * DAY).isoformat()

    def count_slices() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM jobs_slice")
            cursor.fetchone()

    def get(path: str, headers: dict, params: dict | None = None) -> Callable[[], None]:
        def call() -> None:
            response = session.get(f"{url}{path}", headers=headers, params=params, timeout=60)
            if response.status_code != 200:
                raise RuntimeError(f"GET {path}: {response.status_code} {response.text[:200]}")

        return call

    targets: dict[str, Callable[[], None]] = {
        "SELECT count(*) FROM jobs_slice": count_slices,
        "GET /api/kpis (last hour)": get("/api/kpis", api),
        "GET /api/kpis (last day)": get("/api/kpis", api, {"since": day_ago}),
        "GET /api/kpis (last 30 days)": get("/api/kpis", api, {"since": days_ago(30)}),
        f"GET /api/kpis (last {LONG_DAYS} days)": get("/api/kpis", api, {"since": days_ago(LONG_DAYS)}),
        "GET /metrics": get("/metrics", {"Authorization": f"Bearer {metrics_token}"}),
    }
    skipped: dict[str, str] = {}
    try:
        status = session.get(f"{url}/metrics", headers={"Authorization": f"Bearer {metrics_token}"}, timeout=60)
        if status.status_code != 200:
            skipped["GET /metrics"] = f"answered {status.status_code}"
    except requests.RequestException as exc:
        skipped["GET /metrics"] = f"no answer: {exc}"
    for name in skipped:
        targets.pop(name)
    for call in targets.values():  # warm up: each gunicorn worker and thread, the caches
        for _ in range(4):
            call()
    times: dict[str, list[float]] = {name: [] for name in targets}
    for _ in range(rounds):  # interleaved, so that every target sees the same conditions
        for name, call in targets.items():
            t0 = time.perf_counter()
            call()
            times[name].append((time.perf_counter() - t0) * 1000)
    base = statistics_of(times["SELECT count(*) FROM jobs_slice"])
    results = {}
    for name, values in times.items():
        s = statistics_of(values)
        s["ratio_to_count"] = s["median_ms"] / base["median_ms"]
        results[name] = s
    for name, why in skipped.items():
        results[name] = {"skipped": why}
    return results


def statistics_of(values: list[float]) -> dict:
    summary = h.Summary.of(values)
    return {"n": summary.n, "median_ms": summary.median, "p95_ms": p95(values), "max_ms": max(values)}


# --- one database ------------------------------------------------------------------------------------


def run_one(db: str, n_jobs: int, n_slices: int, rounds: int) -> dict:
    metrics_token = secrets.token_urlsafe(32)
    with contextlib.ExitStack() as stack:
        settings = {"CLOCKQ_METRICS_TOKEN": metrics_token}
        if db == "postgres":
            settings["DATABASE_URL"] = stack.enter_context(postgres_cluster())
        q = stack.enter_context(h.private_clockq("clockq-bench-kpis-", **settings))
        from django.db import connection
        from django.utils import timezone
        from knox.models import AuthToken

        from clockq.bus import heartbeat
        from clockq.bus.client import client
        from clockq.kpis import reports as kpis
        from clockq.kpis.models import GpuMinute, KpiMinute

        now = timezone.now()
        t0 = time.perf_counter()
        written = write_history(n_jobs, n_slices, now)
        analyze()
        build_s = time.perf_counter() - t0
        print(f"[{db}] wrote {written} in {build_s:.1f} s", flush=True)
        for gpu in range(GPUS):  # alive, so that the rollup records their capacity
            heartbeat.announce(client(), {"hostname": f"gpu{gpu}@bench", "gpu": gpu})
        # The backfill, in runs of at most kpi_rollup.BUDGET_S each, as the periodic task does it.
        runs: list[float] = []
        while not runs or not rolled_up_to_now():
            t0 = time.perf_counter()
            kpis.rollup()
            runs.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        kpis.rollup()
        steady_s = time.perf_counter() - t0
        rows = {"kpi_minutes": KpiMinute.objects.count(), "gpu_minutes": GpuMinute.objects.count()}
        print(
            f"[{db}] rollup: backfill {sum(runs):.1f} s in {len(runs)} runs, steady {steady_s * 1000:.0f} ms",
            flush=True,
        )
        t0 = time.perf_counter()
        copied = extend_hours(LONG_DAYS)
        analyze()
        print(f"[{db}] {copied} hourly rows for {LONG_DAYS} days in {time.perf_counter() - t0:.1f} s", flush=True)
        series_ms = []
        for _ in range(10):
            t0 = time.perf_counter()
            kpis.series(timezone.now() - DAY, timezone.now())
            series_ms.append((time.perf_counter() - t0) * 1000)
        _service, url = h.start_gunicorn(q)
        from django.contrib.auth.models import User

        _instance, api_token = AuthToken.objects.create(user=User.objects.get(username="bench"))
        timings = time_everything(url, api_token, metrics_token, rounds)
        return {
            "database": database_name(connection),
            "written": written,
            "build_s": build_s,
            "rollup_backfill_s": sum(runs),
            "rollup_backfill_runs": len(runs),
            "rollup_longest_run_s": max(runs),
            "rollup_steady_ms": steady_s * 1000,
            "series_day_median_ms": h.Summary.of(series_ms).median,
            "rollup_rows": rows,
            "timings": timings,
        }


def rolled_up_to_now() -> bool:
    from django.db.models import Max
    from django.utils import timezone

    from clockq.kpis.models import KpiMinute
    from clockq.policy.kpis import floor_minute

    last = KpiMinute.objects.aggregate(last=Max("minute"))["last"]
    return last is not None and last >= floor_minute(timezone.now()) - timedelta(minutes=1)


def report(result: dict) -> None:
    print(f"\n== {result['database']}: {result['written']}")
    print(
        f"rollup: backfill of the day {result['rollup_backfill_s']:.1f} s in {result['rollup_backfill_runs']} runs "
        f"(longest {result['rollup_longest_run_s']:.1f} s); steady run {result['rollup_steady_ms']:.0f} ms; "
        f"rows {result['rollup_rows']}; kpis.series() of the day in process: {result['series_day_median_ms']:.0f} ms"
    )
    print(f"{'what':<34} {'n':>4} {'median ms':>10} {'p95 ms':>8} {'max ms':>8} {'x count(*)':>10}  goal")
    for name, s in result["timings"].items():
        if "skipped" in s:
            print(f"{name:<34} skipped: {s['skipped']}")
            continue
        goal = "" if name.startswith("SELECT") else ("ok" if s["p95_ms"] < P95_GOAL_MS else "MISSED")
        print(
            f"{name:<34} {s['n']:>4} {s['median_ms']:>10.1f} {s['p95_ms']:>8.1f} {s['max_ms']:>8.1f}"
            f" {s['ratio_to_count']:>10.2f}  {goal}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--slices", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=40, help="timed requests per endpoint")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    argv = ["--jobs", str(args.jobs), "--slices", str(args.slices), "--rounds", str(args.rounds)]
    run = functools.partial(run_one, args.db, args.jobs, args.slices, args.rounds)
    run_per_database(args, __file__, argv, run, report, rule=100)


if __name__ == "__main__":
    main()
