"""clockq's own Celery app, with timers: where a switch's time goes inside the pool child.

bench/switch_cost.py starts one extra GPU worker with `-A bench._probe_app` instead of
`-A clockq`. The app, its settings and its tasks are clockq's, unchanged. In each pool child
this module times every SQL statement, COMMIT, database connect and close, Redis command and
log record, the slice runner's main steps (FUNCTIONS), and notes when each task body starts
and ends (task_prerun, task_postrun). After each task it appends one line per record to a file
in BENCH_PROBE_DIR: `kind start_wall_s duration_s`. The timers cost a few microseconds per call,
so this run is reported apart from the plain one. A function that has moved is skipped, and
named in a `missing` record.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import time
from pathlib import Path

from celery.signals import task_postrun, task_prerun, worker_process_init

from clockq.celery import app

__all__ = ["app"]

_records: list[tuple[str, float, float]] = []

# (module, attribute path): the steps of a switch in workers/slice_runner.py and its parts in
# workers/run/, and what they call. A function is patched in the namespace its caller looks it up
# in: the parts call `queues.waiting_by_rank()` and `registry.create()` through their modules, but
# `transition` and `claim_job` by their own imported names, and clockq/jobs/transitions.py calls
# `publish_dispatch` by its imported name.
FUNCTIONS = (
    ("workers.slice_runner", "JobRun._at_boundary"),
    ("clockq.bus.queues", "waiting_by_rank"),
    ("workers.run.checkpointer", "Checkpointer.take"),
    ("clockq.jobs.checkpoints", "CheckpointStore.write"),
    ("workers.run.slice_writes", "SliceWrites.end"),
    ("workers.run.slice_writes", "transition"),
    ("workers.run.slice_writes", "SliceWrites._save_slice"),
    ("clockq.jobs.transitions", "publish_dispatch"),
    ("workers.slice_runner", "claim_job"),
    # The hand-over (a switch without the broker): the order's read, the claim's row and CAS.
    ("workers.slice_runner", "_hand_over"),
    ("workers.slice_runner", "wait_while_lent"),
    ("workers.slice_runner", "take_handed_over"),
    ("workers.slice_runner", "take_warm_next"),
    ("clockq.jobs.order", "next_for_gpu"),
    ("workers.run.claim", "_queued_row"),
    ("workers.run.claim", "_claim_row"),
    ("workers.warm_cache", "WarmCache.take"),
    # The boundary's read: ahead, on the reader thread, or afresh on the GPU's path.
    ("workers.run.boundary", "SliceBoundary._prefetch_boundary"),
    ("workers.run.boundary", "SliceBoundary._read_boundary"),
    ("workers.run.boundary", "SliceBoundary._prefetched"),
    ("workers.run.claim", "transition"),
    ("workers.slice_runner", "JobRun.__init__"),
    ("workers.run.restore", "Restore.workload"),
    ("workers.workloads.registry", "create"),
    ("clockq.jobs.checkpoints", "CheckpointStore.restore"),
    # The ORM's entry points, and its compile-and-execute (SQL built from a query, then run).
    ("django.db.models.query", "QuerySet.first"),
    ("django.db.models.query", "QuerySet.get"),
    ("django.db.models.query", "QuerySet.update"),
    ("django.db.models.query", "QuerySet.create"),
    ("django.db.transaction", "Atomic.__enter__"),
    ("django.db.transaction", "Atomic.__exit__"),
    ("django.db.models.sql.compiler", "SQLCompiler.execute_sql"),
    ("django.db.models.sql.compiler", "SQLInsertCompiler.execute_sql"),
)


def _timed(kind: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start, t0 = time.time(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _records.append((kind, start, time.perf_counter() - t0))

    return wrapper


def _sql(execute, sql, params, many, context):
    start, t0 = time.time(), time.perf_counter()
    try:
        return execute(sql, params, many, context)
    finally:
        _records.append(("sql", start, time.perf_counter() - t0))


@worker_process_init.connect
def _install(**_kwargs) -> None:
    import redis
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.signals import connection_created

    BaseDatabaseWrapper.connect = _timed("connect", BaseDatabaseWrapper.connect)
    BaseDatabaseWrapper._commit = _timed("commit", BaseDatabaseWrapper._commit)
    BaseDatabaseWrapper.close = _timed("close", BaseDatabaseWrapper.close)
    redis.Redis.execute_command = _timed("redis", redis.Redis.execute_command)
    redis.client.Pipeline.execute = _timed("redis", redis.client.Pipeline.execute)
    logging.Logger.handle = _timed("log", logging.Logger.handle)
    connection_created.connect(_add_sql_timer, weak=False)
    for module_name, path in FUNCTIONS:
        _time_function(module_name, path)


def _time_function(module_name: str, path: str) -> None:
    *parents, name = path.split(".")
    try:
        owner = importlib.import_module(module_name)
        for parent in parents:
            owner = getattr(owner, parent)
        setattr(owner, name, _timed(f"{module_name.rsplit('.', 1)[-1]}.{path}", getattr(owner, name)))
    except (ImportError, AttributeError):
        _records.append((f"missing {module_name}.{path}", time.time(), 0.0))


def _add_sql_timer(sender, connection, **_kwargs) -> None:
    # The wrapper list outlives the connection (one is opened per task): add the timer once.
    if _sql not in connection.execute_wrappers:
        connection.execute_wrappers.append(_sql)


@task_prerun.connect
def _prerun(**_kwargs) -> None:
    _records.append(("prerun", time.time(), 0.0))


@task_postrun.connect
def _postrun(**_kwargs) -> None:
    _records.append(("postrun", time.time(), 0.0))
    path = Path(os.environ["BENCH_PROBE_DIR"]) / f"probe-{os.getpid()}.txt"
    with open(path, "a") as out:
        out.writelines(f"{kind} {start!r} {dur!r}\n" for kind, start, dur in _records)
    _records.clear()
