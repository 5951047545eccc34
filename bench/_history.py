"""A day of history for bench/kpis.py, written straight into the tables: jobs, their slices
and their events, as a busy cluster leaves them (see that module's docstring)."""

from __future__ import annotations

import itertools
import json
import random
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

GPUS = 8
SLICES_PER_JOB = 10
DAY = timedelta(days=1)
TIERS = {"RT": 0.2, "HP": 0.2, "SP": 0.3, "BP": 0.15, "BK": 0.15}
MEAN_WAIT_MS = {"RT": 30, "HP": 20_000, "SP": 300_000, "BP": 3_600_000, "BK": 7_200_000}
# Outcomes of a job's slices before its last one.
MIDDLE_OUTCOMES = (("yielded", 0.60), ("continued", 0.35), ("lost", 0.02), ("failed", 0.02), ("fault", 0.01))
BATCH_JOBS = 2_000  # jobs (and their slices and events) per insert batch


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


class History:
    """The writer of one day: each GPU runs slices back to back in slots of `slot`, each
    `gap` short of the next, from `start`."""

    def __init__(self, connection, n_slices: int, end: datetime):
        from django.contrib.auth.models import User

        from clockq.jobs.models import Job, JobEvent, QueueTier, Slice

        self.rng = random.Random(8)
        self.owner = User.objects.create_user("bench", password=secrets.token_urlsafe(16))
        self.tiers = {t.code: t for t in QueueTier.objects.all()}
        self.per_gpu = n_slices // GPUS
        self.slot = DAY / self.per_gpu
        self.gap = min(self.slot / 20, timedelta(milliseconds=40))
        self.start = end - DAY
        self.jobs, self.slices = FastInsert(Job, connection), FastInsert(Slice, connection)
        self.events = FastInsert(JobEvent, connection)
        self.job_ids, self.slice_ids, self.event_ids = itertools.count(1), itertools.count(1), itertools.count(1)

    def tables(self) -> tuple[FastInsert, ...]:
        return (self.jobs, self.slices, self.events)

    def event(self, job_id: int, at: datetime, from_state: str, to_state: str, reason: str, actor: str) -> None:
        self.events.add(
            id=next(self.event_ids), job_id=job_id, at=at, from_state=from_state, to_state=to_state, reason=reason,
            actor=actor,
        )  # fmt: skip

    def job(self, gpu: int, first_pos: int) -> None:
        """One job on `gpu`, its SLICES_PER_JOB slices from slot `first_pos`, and its events."""
        rng = self.rng
        job_id = next(self.job_ids)
        code = rng.choices(list(TIERS), list(TIERS.values()))[0]
        tier = self.tiers[code]
        first_start = self.start + self.slot * first_pos
        last_end = self.start + self.slot * (first_pos + SLICES_PER_JOB) - self.gap
        wait_ms = int(rng.expovariate(1 / MEAN_WAIT_MS[code]))
        submitted = first_start - timedelta(milliseconds=wait_ms)
        state, final = ("failed", "failed") if rng.random() < 0.04 else ("succeeded", "completed")
        deadline = None
        if rng.random() < 0.2:
            deadline = last_end + timedelta(seconds=rng.uniform(-600, 3600))
            if deadline < last_end:
                state, final = "timed_out", "yielded"
        if rng.random() < 0.02:
            state, final = "cancelled", "yielded"
        target = tier.wait_target_ms
        worker = f"gpu{gpu}@bench"
        self.jobs.add(
            id=job_id,
            owner_id=self.owner.pk,
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
        self.event(job_id, submitted, "", "queued", f"submitted to {code}", "bench")
        if code == "SP" and rng.random() < 0.01:
            promoted = "promoted SP -> HP for one slice: skipped in 3 consecutive rounds"
            self.event(job_id, submitted + timedelta(milliseconds=wait_ms / 2), "queued", "queued", promoted,
                       "promotion tick")  # fmt: skip
        self.job_slices(job_id, gpu, first_pos, final)

    def job_slices(self, job_id: int, gpu: int, first_pos: int, final: str) -> None:
        """The job's slices, back to back; the last one ends as `final`."""
        rng = self.rng
        outcomes, outcome_weights = zip(*MIDDLE_OUTCOMES, strict=True)
        worker = f"gpu{gpu}@bench"
        for k in range(SLICES_PER_JOB):
            began = self.start + self.slot * (first_pos + k)
            ended = began + self.slot - self.gap
            outcome = final if k == SLICES_PER_JOB - 1 else rng.choices(outcomes, outcome_weights)[0]
            wall_ms = (ended - began) / timedelta(milliseconds=1)
            checkpoint_ms = rng.uniform(5, 30) if outcome == "yielded" else 0.0
            restore_ms = rng.uniform(3, 20) if k else 0.0
            used_ms = 0 if outcome == "lost" else int(wall_ms - checkpoint_ms - restore_ms)
            self.slices.add(
                id=next(self.slice_ids),
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
            self.event(job_id, began, "queued", "running", f"claimed on GPU {gpu}", worker)


def write_history(n_jobs: int, n_slices: int, end: datetime) -> dict[str, int]:
    """A day of back-to-back slices on GPUS GPUs ending at `end`; see bench/kpis.py."""
    from django.db import connection, transaction

    history = History(connection, n_slices, end)
    blocks = min(history.per_gpu // SLICES_PER_JOB, n_jobs // GPUS)
    with transaction.atomic():
        for block in range(blocks):
            for gpu in range(GPUS):
                history.job(gpu, block * SLICES_PER_JOB)
            if block % (BATCH_JOBS // GPUS) == 0:
                for table in history.tables():
                    table.flush()
        for table in history.tables():
            table.flush()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for table in ("jobs_job", "jobs_slice", "jobs_jobevent"):
                cursor.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
    jobs, slices, events = history.tables()
    return {"jobs": jobs.count, "slices": slices.count, "events": events.count}


def analyze() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


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
