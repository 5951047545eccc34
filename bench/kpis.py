"""Benchmark (issue 8): GET /api/kpis and GET /metrics with 100,000 jobs and 1,000,000 slices in
the database, on SQLite and on PostgreSQL, each against a bare `SELECT count(*)` on the slice
table in the same run. Goal: every endpoint under 300 ms at p95.

    .venv/bin/python bench/kpis.py                        # both databases, full size
    .venv/bin/python bench/kpis.py --db sqlite --jobs 10000 --slices 100000   # a quick look

Per database, in a private clockq (bench/_harness.py: its own directory, redis-server and,
for PostgreSQL, a throwaway cluster made with initdb as .ci/run does):

1. One day of history on 8 GPUs, ending now: every GPU runs slices back to back (10 per job,
   about 0.65 s each), jobs in five tiers with waits, deadlines, late marks, failures, lost
   slices and cancellations; an event per job and per slice, and a promotion for 1 SP job in
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
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import _harness as h
import requests

GPUS = 8
SLICES_PER_JOB = 10
DAY = timedelta(days=1)
LONG_DAYS = 365  # the longest window /api/kpis takes is 366 days
P95_GOAL_MS = 300.0
TIERS = {"RT": 0.2, "HP": 0.2, "SP": 0.3, "BP": 0.15, "BK": 0.15}
MEAN_WAIT_MS = {"RT": 30, "HP": 20_000, "SP": 300_000, "BP": 3_600_000, "BK": 7_200_000}
# Outcomes of a job's slices before its last one.
MIDDLE_OUTCOMES = (("yielded", 0.60), ("continued", 0.35), ("lost", 0.02), ("failed", 0.02), ("fault", 0.01))
BATCH_JOBS = 2_000  # jobs (and their slices and events) per insert batch


# --- PostgreSQL ---------------------------------------------------------------------------------


@contextlib.contextmanager
def postgres_cluster() -> Iterator[str]:
    """A throwaway PostgreSQL cluster, made and started as .ci/run does; its database URL."""
    as_pg: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root
        user = "postgres" if shutil.which("runuser") and _user_exists("postgres") else "nobody"
        as_pg = ["runuser", "-u", user, "--"]
    pgdir = Path(tempfile.mkdtemp(prefix="clockq-bench-pg."))
    pgdir.chmod(0o755)
    if as_pg:
        shutil.chown(pgdir, as_pg[2])
    port = h.free_port()
    data = pgdir / "data"
    try:
        subprocess.run(
            [*as_pg, "initdb", "-D", str(data), "-A", "trust", "-U", "clockq"], check=True, capture_output=True
        )
        options = f"-p {port} -k {pgdir} -c listen_addresses=127.0.0.1 -c fsync=off -c shared_buffers=512MB"
        subprocess.run(
            [*as_pg, "pg_ctl", "-D", str(data), "-l", str(pgdir / "log"), "-w", "start", "-o", options],
            check=True,
            capture_output=True,
        )
        subprocess.run([*as_pg, "createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "clockq", "clockq"], check=True)
        yield f"postgres://clockq@127.0.0.1:{port}/clockq"
    finally:
        subprocess.run([*as_pg, "pg_ctl", "-D", str(data), "-m", "fast", "stop"], capture_output=True, check=False)
        shutil.rmtree(pgdir, ignore_errors=True)


def _user_exists(name: str) -> bool:
    return subprocess.run(["id", name], capture_output=True, check=False).returncode == 0


# --- writing a day of history -------------------------------------------------------------------


class FastInsert:
    """Rows of one model straight into its table: executemany on SQLite, COPY on PostgreSQL.
    Fields left out take their model default; ids are given, so slices can name their jobs."""

    def __init__(self, model, connection):
        self.connection = connection
        self.fields = [f for f in model._meta.concrete_fields]
        self.table = model._meta.db_table
        self.columns = [f.column for f in self.fields]
        self.postgres = connection.vendor == "postgresql"
        self.rows: list[tuple] = []
        self.count = 0
        self._convert: list[Callable] = [self._converter(f) for f in self.fields]

    def _converter(self, field) -> Callable:
        kind = field.get_internal_type()
        if kind == "DateTimeField" and not self.postgres:
            return lambda v: None if v is None else v.astimezone(UTC).replace(tzinfo=None).isoformat(" ")
        if kind == "JSONField":
            return json.dumps
        return lambda v: v

    def add(self, **values) -> None:
        row = []
        for field, convert in zip(self.fields, self._convert, strict=True):
            value = values[field.attname] if field.attname in values else field.get_default()
            row.append(convert(value))
        self.rows.append(tuple(row))

    def flush(self) -> None:
        if not self.rows:
            return
        with self.connection.cursor() as cursor:
            if self.postgres:
                with cursor.cursor.copy(f"COPY {self.table} ({', '.join(self.columns)}) FROM STDIN") as copy:
                    for row in self.rows:
                        copy.write_row(row)
            else:
                marks = ", ".join(["%s"] * len(self.columns))
                cursor.executemany(f"INSERT INTO {self.table} ({', '.join(self.columns)}) VALUES ({marks})", self.rows)
        self.count += len(self.rows)
        self.rows = []


def write_history(n_jobs: int, n_slices: int, end: datetime) -> dict[str, int]:
    """A day of back-to-back slices on GPUS GPUs ending at `end`; see the module docstring."""
    from django.contrib.auth.models import User
    from django.db import connection, transaction

    from clockq.jobs.models import Job, JobEvent, QueueTier, Slice

    rng = random.Random(8)
    owner = User.objects.create_user("bench", password=secrets.token_urlsafe(16))
    tiers = {t.code: t for t in QueueTier.objects.all()}
    per_gpu = n_slices // GPUS
    slot = DAY / per_gpu
    gap = min(slot / 20, timedelta(milliseconds=40))
    start = end - DAY
    jobs, slices, events = FastInsert(Job, connection), FastInsert(Slice, connection), FastInsert(JobEvent, connection)
    codes, weights = list(TIERS), list(TIERS.values())
    outcomes, outcome_weights = zip(*MIDDLE_OUTCOMES, strict=True)
    job_id = slice_id = event_id = 0
    blocks = min(per_gpu // SLICES_PER_JOB, n_jobs // GPUS)
    with transaction.atomic():
        for block in range(blocks):
            for gpu in range(GPUS):
                job_id += 1
                code = rng.choices(codes, weights)[0]
                tier = tiers[code]
                first_pos = block * SLICES_PER_JOB
                first_start = start + slot * first_pos
                last_end = start + slot * (first_pos + SLICES_PER_JOB) - gap
                wait_ms = int(rng.expovariate(1 / MEAN_WAIT_MS[code]))
                submitted = first_start - timedelta(milliseconds=wait_ms)
                roll = rng.random()
                state, final = ("failed", "failed") if roll < 0.04 else ("succeeded", "completed")
                deadline = None
                if rng.random() < 0.2:
                    deadline = last_end + timedelta(seconds=rng.uniform(-600, 3600))
                    if deadline < last_end:
                        state, final = "timed_out", "yielded"
                if rng.random() < 0.02:
                    state, final = "cancelled", "yielded"
                target = tier.wait_target_ms
                worker = f"gpu{gpu}@bench"
                jobs.add(
                    id=job_id,
                    owner_id=owner.pk,
                    name=f"bench-{job_id}",
                    tier_id=tier.pk,
                    original_tier_id=tier.pk,
                    workload="synthetic",
                    params={"steps": 100},
                    deadline=deadline,
                    state=state,
                    progress=1.0 if state == "succeeded" else 0.5,
                    submitted_at=submitted,
                    enqueued_at=submitted,
                    first_started_at=first_start,
                    first_wait_ms=wait_ms,
                    late_at=submitted + timedelta(milliseconds=target) if target and wait_ms > target else None,
                    finished_at=last_end,
                    slice_count=SLICES_PER_JOB,
                    worker=worker,
                )
                event_id += 1
                events.add(
                    id=event_id,
                    job_id=job_id,
                    at=submitted,
                    from_state="",
                    to_state="queued",
                    reason=f"submitted to {code}",
                    actor="bench",
                )
                if code == "SP" and rng.random() < 0.01:
                    event_id += 1
                    events.add(
                        id=event_id,
                        job_id=job_id,
                        at=submitted + timedelta(milliseconds=wait_ms / 2),
                        from_state="queued",
                        to_state="queued",
                        actor="promotion tick",
                        reason="promoted SP -> HP for one slice: skipped in 3 consecutive rounds",
                    )
                for k in range(SLICES_PER_JOB):
                    slice_id += 1
                    began = start + slot * (first_pos + k)
                    ended = began + slot - gap
                    outcome = final if k == SLICES_PER_JOB - 1 else rng.choices(outcomes, outcome_weights)[0]
                    wall_ms = (ended - began) / timedelta(milliseconds=1)
                    checkpoint_ms = rng.uniform(5, 30) if outcome == "yielded" else 0.0
                    restore_ms = rng.uniform(3, 20) if k else 0.0
                    used_ms = 0 if outcome == "lost" else int(wall_ms - checkpoint_ms - restore_ms)
                    slices.add(
                        id=slice_id,
                        job_id=job_id,
                        worker=worker,
                        gpu_index=gpu,
                        started_at=began,
                        ended_at=ended,
                        planned_ms=int(wall_ms),
                        used_ms=used_ms,
                        steps=10,
                        outcome=outcome,
                        checkpoint_ms=checkpoint_ms,
                        restore_ms=restore_ms,
                        gpu_util=None if outcome == "lost" else rng.uniform(0.3, 1.0),
                        plan_reason="formula",
                    )
                    event_id += 1
                    events.add(
                        id=event_id,
                        job_id=job_id,
                        at=began,
                        from_state="queued",
                        to_state="running",
                        reason=f"claimed on GPU {gpu}",
                        actor=worker,
                    )
            if block % (BATCH_JOBS // GPUS) == 0:
                for table in (jobs, slices, events):
                    table.flush()
        for table in (jobs, slices, events):
            table.flush()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for table in ("jobs_job", "jobs_slice", "jobs_jobevent"):
                cursor.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
    return {"jobs": jobs.count, "slices": slices.count, "events": events.count}


def analyze() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


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


def extend_hours(days: int) -> int:
    """A year of hourly rollup rows, copies of the day just rolled up, shifted a day back at a
    time: what KpiHour and GpuHour hold after a year of this load, for the long windows. (Minute
    rows are only read at a window's ragged ends, which the day already has.)"""
    from clockq.kpis.models import GpuHour, KpiHour

    day_hours = list(KpiHour.objects.all())
    day_gpus = list(GpuHour.objects.all())
    copied = 0
    for back in range(1, days + 1):
        shift = timedelta(days=back)
        kpi_rows = [KpiHour(**{**_fields(r), "id": None, "hour": r.hour - shift}) for r in day_hours]
        gpu_rows = [GpuHour(**{**_fields(r), "id": None, "hour": r.hour - shift}) for r in day_gpus]
        KpiHour.objects.bulk_create(kpi_rows, batch_size=1000, ignore_conflicts=True)
        GpuHour.objects.bulk_create(gpu_rows, batch_size=1000, ignore_conflicts=True)
        copied += len(kpi_rows) + len(gpu_rows)
    return copied


def _fields(row) -> dict:
    return {f.attname: getattr(row, f.attname) for f in row._meta.concrete_fields}


def rolled_up_to_now() -> bool:
    from django.db.models import Max
    from django.utils import timezone

    from clockq.kpis.models import KpiMinute
    from clockq.policy.kpis import floor_minute

    last = KpiMinute.objects.aggregate(last=Max("minute"))["last"]
    return last is not None and last >= floor_minute(timezone.now()) - timedelta(minutes=1)


def database_name(connection) -> str:
    if connection.vendor == "sqlite":
        return f"SQLite {connection.Database.sqlite_version}"
    major, minor = divmod(connection.pg_version, 10_000)
    return f"PostgreSQL {major}.{minor}"


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
    if args.db == "both":
        # One process per database: Django is set up once per process.
        results = []
        for db in ("sqlite", "postgres"):
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                argv = [sys.executable, __file__, "--db", db, "--jobs", str(args.jobs), "--slices", str(args.slices)]
                subprocess.run([*argv, "--rounds", str(args.rounds), "--json", out.name], check=True)
                results.append(json.loads(Path(out.name).read_text()))
        print("\n" + "=" * 100)
        for result in results:
            report(result)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return
    result = run_one(args.db, args.jobs, args.slices, args.rounds)
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
