"""What one slice switch costs in clockq, against a bare Celery task re-sending itself.

Usage (from the repository root):

    .venv/bin/python bench/switch_cost.py [--switches 300] [--state-kb 1024] [--slice-ms 20] [--rounds 3]

Everything runs privately and is stopped and deleted at the end: a redis-server on a free port,
a fresh SQLite file, temporary checkpoint and var directories, and one worker at a time.

Steps 1 and 2 are taken in turn, `--rounds` times, so that a machine whose speed drifts (a bare
hop of 3 ms in one minute and 6 ms in the next was seen) meets both alike: the tables pool every
round, and the ratio is the median of the rounds' ratios. The 0 KB and probe runs come once, in
the last round.

1. Bare floor. A Celery app with clockq's broker settings (bench/_bare_app.py) runs one task that
   re-sends itself, under a worker started with exactly clockq's GPU-worker flags (prefork,
   concurrency 1, task events, no mingle or gossip, INFO logging). A hop is the time between
   the starts of two consecutive task bodies.
2. clockq. One real GPU worker (clockq.stack.roles.gpu_worker_argv(0)) and two synthetic SP jobs with
   `--state-kb` of state and 1 ms steps. The SP tier's base and minimum slice are set to
   `--slice-ms` in this run's database. Both jobs share the one GPU. Jobs of one class never
   displace one another (clockq/policy/ordering.py), so the run's service ladder
   (CLOCKQ_SERVICE_LADDER_S, `turn_ladder`) has a rung every 0.9 slice of SP service: the job
   that ran last passes a rung the waiting one has not, and yields to it, about every other
   boundary (every slice switches back when the two jobs' services differ by a rung, A B B A A
   B B …). Each yield is a real switch to the other job, the kind the same worker hands over
   (docs/architecture.md): the jobs are given twice the slices of the switches asked for.
   With `--zero` (the default) a second pair runs with 0 KB of state, to separate checkpoint
   I/O from the rest.
3. Probe (`--probe`, the default). One more pair with `--state-kb`, on a GPU worker started with
   `-A bench._probe_app`: clockq's app unchanged, plus timers in the pool child around SQL
   statements, COMMIT, DB connect and close, Redis commands, logging and the slice runner's main
   functions. It says how much of each phase is database, Redis, or Python around them. It is
   reported apart, since the timers add a little.

A switch is the GPU's idle time from the end of job A's last step to the start of job B's first
step, read from the database after the run (workers/run/slice_writes.py stamps these fields):

    A's compute end   = A.started_at + A.restore_ms + A.used_ms + 0.5 ms
    B's compute start = B.started_at + B.restore_ms
    switch            = B's compute start - A's compute end

`Slice.started_at` is stamped before the restore, and `used_ms` is stored truncated to whole
milliseconds, hence the 0.5 ms: each switch is exact to +-0.5 ms. The switch splits into phases
that add up to it exactly, in the order they happen:

    decide      boundary read of the job row, queue lengths from Redis, BEGIN, the CAS read and update
                of the requeue transition  (A's running->queued JobEvent.at - compute end - checkpoint)
    checkpoint  the snapshot: state into host memory (at a yield, copied in the background while the
                GPU serves the next job) and its Redis mark; or, past the snapshot memory bound, the
                whole write (CRC-32, write, fsync, rename)  (A.checkpoint_ms). The persist itself runs
                in the background, and competes for the CPUs
    record      JobEvent insert and the metric curves' update, up to A.ended_at
    commit      Slice insert, COMMIT, publish of A's requeue message, task return, result to
                the pool's parent, ack  (A.ended_at -> A's Celery task-succeeded event)
    fetch       event flush, BRPOP of B's message, decode  (-> B's task-received event)
    claim       message to the pool child, task start, DB connection, claim read and CAS update
                (-> B's queued->running JobEvent.at)
    start       JobEvent insert, job re-read, COMMIT, tier ranks, up to B.started_at
    restore     workload setup, checkpoint read and verify, load_state_dict  (B.restore_ms)

The Celery event timestamps are stamped by the worker's parent process when it makes each event.
The bare hop splits the same way: publish (the task body sending the next hop), return (to
task-succeeded), fetch (to the next task-received) and to child (to the next task body).

The first `--warmup` switches (and hops) are dropped: the first restore has no checkpoint.
"""

from __future__ import annotations

import argparse
import math
import socket
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

import redis
from _harness import ROOT, EventLog, Service, private_clockq, wait_for
from _harness import turn_ladder as _harness_turn_ladder
from _switch_analysis import (
    BARE_PHASES,
    Measured,
    Probed,
    SwitchTimes,
    celery_tasks,
    find_switches,
    measure,
    ms,
    report,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--switches", type=int, default=300, help="switches (and bare hops) to measure per run")
    p.add_argument("--state-kb", type=int, default=1024, help="checkpoint state per job, in KiB")
    p.add_argument("--slice-ms", type=int, default=20, help="SP base and minimum slice for this run")
    p.add_argument("--step-ms", type=float, default=1.0, help="synthetic step length")
    p.add_argument("--warmup", type=int, default=4, help="switches and hops dropped at the start")
    p.add_argument(
        "--zero", action=argparse.BooleanOptionalAction, default=True, help="also run with 0 KB of state (default: on)"
    )
    p.add_argument(
        "--probe",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run a worker with timers on SQL, Redis and the task body (default: on)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="bare and clockq runs, taken in turn, so that a machine whose speed drifts meets both alike; "
        "the ratio is the median of the rounds' ratios (default: 3)",
    )
    p.add_argument("--tmp-dir", type=Path, default=None, help="where the temporary directory goes")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, database)")
    args = p.parse_args(argv)
    if args.switches < 10 or args.slice_ms < 1 or args.step_ms <= 0 or args.warmup < 0 or args.state_kb < 0:
        p.error("need --switches >= 10, --slice-ms >= 1, --step-ms > 0, --warmup >= 0, --state-kb >= 0")
    if args.rounds < 1:
        p.error("need --rounds >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    try:
        # No overhead stretching, so that every boundary is a switch at the slice length asked for.
        with private_clockq(
            "clockq-switch-cost-",
            tmp_dir=args.tmp_dir,
            keep=args.keep,
            CLOCKQ_GPUS="sim:1",
            CLOCKQ_OVERHEAD_BUDGET="0",
            CLOCKQ_SERVICE_LADDER_S=turn_ladder(args),
        ) as stack:
            stack.setenv(BENCH_BROKER_URL=stack.broker_url)  # read by _bare_app at import
            import _bare_app as bare_app

            notes = compare_broker_settings(bare_app)
            events = EventLog(bare_app.app).start()
            rounds: list[tuple[Measured, list[Measured]]] = []
            try:
                for i in range(args.rounds):
                    last = i == args.rounds - 1  # the 0 KB and probe runs, once, at the end
                    bare = run_bare(bare_app, args, stack.env, stack.work, stack.services, events)
                    clockq_runs, probed = run_clockq(args, stack.env, stack.work, stack.services, events, extra=last)
                    rounds.append((bare, clockq_runs))
            finally:
                events.stop()
    except (TimeoutError, RuntimeError, subprocess.SubprocessError) as exc:
        print(f"switch_cost: {exc}", file=sys.stderr)
        return 1

    report(args, stack.work, rounds, probed, notes, time.monotonic() - started)
    return 0


# --- setup ----------------------------------------------------------------------------------


def slices_per_job(args) -> int:
    """Enough slices for each job to take part in (switches + warmup) switches and a few more:
    a switch about every other slice (`turn_ladder`)."""
    return args.switches + args.warmup + 3


def turn_ladder(args) -> str:
    """The run's service ladder: the jobs take turns about every other slice (_harness.turn_ladder)."""
    return _harness_turn_ladder(args.slice_ms, slices_per_job(args))


def compare_broker_settings(bare_app) -> list[str]:
    """Say so if the bare app no longer has clockq's broker settings."""
    from clockq.celery import app as clockq_app

    keys = (
        "task_acks_late",
        "worker_prefetch_multiplier",
        "task_serializer",
        "accept_content",
        "task_reject_on_worker_lost",
    )
    notes = [
        f"bare app differs from clockq in {key}: {bare_app.app.conf[key]!r} vs {clockq_app.conf[key]!r}"
        for key in keys
        if bare_app.app.conf[key] != clockq_app.conf[key]
    ]
    ours = bare_app.app.conf.broker_transport_options.get("queue_order_strategy")
    theirs = clockq_app.conf.broker_transport_options.get("queue_order_strategy")
    if ours != theirs:
        notes.append(f"bare app queue_order_strategy {ours!r} vs clockq {theirs!r}")
    return notes


def worker_argv(app_module: str, hostname: str, queues: tuple[str, ...] | None = None) -> list[str]:
    """clockq's GPU-worker command line, with only the app, hostname and queues replaced."""
    from clockq.stack.roles import gpu_worker_argv

    argv = gpu_worker_argv(0)
    replace = {"-A": app_module, "--hostname": hostname}
    if queues:
        replace["--queues"] = ",".join(queues)
    for flag, value in replace.items():
        argv[argv.index(flag) + 1] = value
    return argv


def start_worker(
    name: str,
    argv: list[str],
    env: dict[str, str],
    log: Path,
    ready,
    services: list[Service],
    events: EventLog,
    hostname: str,
) -> Service:
    worker = Service(name, argv, env, ROOT, log)
    services.append(worker)
    worker.start()

    def is_ready() -> bool:
        worker.check_alive()
        return bool(ready())

    wait_for(is_ready, 90, f"{name} to be ready", interval=0.1)
    # The worker-online event proves the event receiver hears this worker.
    try:
        wait_for(lambda: hostname in events.seen_workers, 10, f"events from {name}")
    except TimeoutError:
        print(f"warning: no Celery events seen from {hostname}; phases will be missing", file=sys.stderr)
    return worker


def stop_worker(worker: Service, services: list[Service]) -> None:
    worker.stop()
    services.remove(worker)


# --- the bare floor -------------------------------------------------------------------------


def run_bare(bare_app, args, env: dict[str, str], work: Path, services: list[Service], events: EventLog) -> Measured:
    client = redis.Redis.from_url(env["REDIS_URL"])
    hostname = f"bare@{socket.gethostname()}"
    # Without DJANGO_SETTINGS_MODULE, Celery's Django fix-up stays off: the bare worker is bare.
    bare_env = {k: v for k, v in env.items() if k != "DJANGO_SETTINGS_MODULE"}
    argv = worker_argv("bench._bare_app", hostname, bare_app.QUEUES)
    client.delete(bare_app.READY_KEY)  # left by an earlier round's worker
    worker = start_worker(
        "bare worker",
        argv,
        bare_env,
        work / "bare-worker.log",
        lambda: client.exists(bare_app.READY_KEY),
        services,
        events,
        hostname,
    )

    run = uuid.uuid4().hex[:12]
    sends = args.switches + args.warmup  # hops; the task runs sends + 1 times
    bare_app.hop.apply_async((run, sends), queue=bare_app.HOP_QUEUE, routing_key=bare_app.HOP_QUEUE)
    key = bare_app.stamps_key(run)

    def finished() -> bool:
        worker.check_alive()
        return bool(client.exists(key))

    wait_for(finished, 60 + sends * 0.05, "the bare hops to finish", interval=0.1)
    time.sleep(0.5)  # the last events are flushed with the worker's next loop turn
    stop_worker(worker, services)

    stamps = [tuple(map(float, raw.split())) for raw in client.lrange(key, 0, -1)]
    tasks = celery_tasks(events.snapshot(), bare_app.HOP_TASK)
    by_remaining = {int(t.args[1]): t for t in tasks if t.args and t.args[0] == run}
    totals: list[float] = []
    phases: dict[str, list[float]] = defaultdict(list)
    for i in range(args.warmup, len(stamps) - 1):
        (enter, sent), (next_enter, _) = stamps[i], stamps[i + 1]
        totals.append(ms(next_enter - enter))
        this, nxt = by_remaining.get(sends - i), by_remaining.get(sends - i - 1)
        if this and nxt and this.succeeded and nxt.received:
            for name, value in zip(
                BARE_PHASES,
                (sent - enter, this.succeeded - sent, nxt.received - this.succeeded, next_enter - nxt.received),
                strict=True,
            ):
                phases[name].append(ms(value))
    return Measured("bare Celery hop", totals, dict(phases), [])


# --- clockq ---------------------------------------------------------------------------------


def run_clockq(
    args, env: dict[str, str], work: Path, services: list[Service], events: EventLog, extra: bool = True
) -> tuple[list[Measured], Probed | None]:
    """The `--state-kb` pair; with `extra`, also the 0 KB pair (--zero) and the probe run (--probe)."""
    from django.contrib.auth import get_user_model

    from clockq.bus.heartbeat import KEY_PREFIX
    from clockq.jobs.models import QueueTier
    from workers.gpus import gpu_worker_env, simulated_gpus

    QueueTier.objects.filter(code="SP").update(base_slice_ms=args.slice_ms, min_slice_ms=args.slice_ms)
    owner, _ = get_user_model().objects.get_or_create(username="switch-bench")
    client = redis.Redis.from_url(env["REDIS_URL"])
    worker_env = {**env, **gpu_worker_env(simulated_gpus(1)[0])}

    def start(app_module: str, hostname: str, log_name: str) -> Service:
        client.delete(KEY_PREFIX + hostname)  # an earlier round's worker's heartbeat
        return start_worker(
            f"GPU worker ({app_module})",
            worker_argv(app_module, hostname),
            worker_env,
            work / log_name,
            lambda: client.exists(KEY_PREFIX + hostname),
            services,
            events,
            hostname,
        )

    worker = start("clockq", f"gpu0@{socket.gethostname()}", "gpu-worker.log")
    runs = []
    for state_kb in (args.state_kb, 0) if extra and args.zero and args.state_kb != 0 else (args.state_kb,):
        switches, notes = run_clockq_pair(args, state_kb, owner, worker, events)
        runs.append(measure(f"clockq switch, {state_kb} KB state", switches, notes))
    stop_worker(worker, services)
    if not (extra and args.probe):
        return runs, None

    probe_dir = work / "probe"
    probe_dir.mkdir()
    worker_env["BENCH_PROBE_DIR"] = str(probe_dir)
    worker = start("bench._probe_app", f"gpu0-probe@{socket.gethostname()}", "gpu-worker-probe.log")
    switches, _notes = run_clockq_pair(args, args.state_kb, owner, worker, events)
    stop_worker(worker, services)
    return runs, Probed(args.state_kb, switches, load_probe(probe_dir))


def run_clockq_pair(
    args, state_kb: int, owner, worker: Service, events: EventLog
) -> tuple[list[SwitchTimes], list[str]]:
    """Two synthetic SP jobs sharing the one GPU, run to the end; their switches."""
    from clockq.jobs import workloads
    from clockq.jobs.models import Job, JobEvent, Slice
    from clockq.jobs.services import submit_job

    steps = math.ceil(slices_per_job(args) * args.slice_ms / args.step_ms)
    # gpu_util 0.45 makes the slice formula give exactly the base slice (0.9 would give 1.2x).
    spec = {"steps": steps, "step_ms": args.step_ms, "state_kb": state_kb, "gpu_util": 0.45}
    params = workloads.validate("synthetic", spec, may_run_commands=False)
    jobs = [
        submit_job(owner=owner, name=f"switch-{state_kb}kb-{x}", tier_code="SP", workload="synthetic", params=params)
        for x in "ab"
    ]
    ids = [job.pk for job in jobs]

    def finished() -> bool:
        worker.check_alive()
        return not Job.objects.filter(pk__in=ids, state__in=["queued", "running"]).exists()

    expected_s = 2 * slices_per_job(args) * (args.slice_ms + 40) / 1000
    wait_for(finished, 60 + 3 * expected_s, f"the {state_kb} KB jobs to finish", interval=0.25)
    time.sleep(0.5)  # the last events are flushed with the worker's next loop turn
    states = dict(Job.objects.filter(pk__in=ids).values_list("pk", "state"))
    if any(state != "succeeded" for state in states.values()):
        raise RuntimeError(f"jobs did not succeed: {states}; worker log:\n{worker.tail()}")

    slices = list(
        Slice.objects.filter(job_id__in=ids)
        .order_by("started_at", "id")
        .values(
            "job_id", "started_at", "ended_at", "used_ms", "outcome", "checkpoint_ms", "checkpoint_bytes", "restore_ms"
        )
    )
    job_events = list(JobEvent.objects.filter(job_id__in=ids).values_list("job_id", "from_state", "to_state", "at"))
    tasks = [t for t in celery_tasks(events.snapshot(), "clockq.run_slice") if t.args and t.args[0] in ids]
    sizes = sorted({s["checkpoint_bytes"] for s in slices if s["outcome"] == "yielded"})
    notes = [
        f"{len(slices)} slices, {steps} steps of {args.step_ms:g} ms per job, "
        f"checkpoint {'/'.join(map(str, sizes)) or 0} bytes"
    ]
    return find_switches(slices, job_events, tasks, args.warmup, notes), notes


def load_probe(probe_dir: Path) -> list[tuple[str, float, float]]:
    records = []
    for path in probe_dir.glob("probe-*.txt"):
        for line in path.read_text().splitlines():
            kind, start, duration = line.split()
            records.append((kind, float(start), float(duration)))
    return sorted(records, key=lambda r: r[1])


if __name__ == "__main__":
    sys.exit(main())
