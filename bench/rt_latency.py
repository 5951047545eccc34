"""RT submit-to-start latency behind busy GPUs whose lower-tier jobs hold several state sizes,
each against idle GPUs and against the smallest size, in one run.

Usage (from the repository root):

    .venv/bin/python bench/rt_latency.py [--gpus 2] [--rt-jobs 100] [--busy-tier SP] [--busy-slice-ms 500]
                                         [--busy-state-mb 1 64 256 1024] [--no-rt-lane]

Everything runs privately and is stopped and deleted at the end: a redis-server on a free port,
a fresh SQLite file, temporary checkpoint and var directories, and one GPU worker per simulated
GPU (started as `gpuworkers` starts them). CLOCKQ_OVERHEAD_BUDGET is left at its default. RT's
start timeout (1 s) is lifted, so that an RT job claimed later than that (behind a large
checkpoint) is measured instead of ending timed_out; the report counts those starts.

1. Idle, once (the baseline). `--rt-jobs` RT jobs (synthetic, 1 step of 1 ms) are submitted one
   at a time, each after the previous one finished and a random gap of `--gap-ms`, onto idle GPUs.
2. Busy, once per `--busy-state-mb` size, in the order given. The busy tier's base and minimum
   slice are set to `--busy-slice-ms` (500 ms), so the next ordinary slice end is on average
   250 ms away, and one fresh long synthetic job of that tier (10 ms steps, that many MB of
   state, 1,000,000 steps) is started per GPU. Then the same RT sequence: before each submission
   every busy job is running again (in the database), plus the random gap. A preempted job that
   moved to the other GPU restores its state from disk, which takes longer the larger it is; the
   report counts the RT signals that came while it was still restoring. At the end of each size
   the busy jobs are cancelled, and the next size starts only once the database shows none of
   them running and every worker that ran one has logged that it stopped it. Every busy GPU
   hears an RT signal and asks the order; only the job it names (the cheapest switch) ends its
   slice, and the report counts what each GPU ran next after a busy slice yielded. Waits time
   out after a limit that grows with the state size (a 256 MB checkpoint takes a while on 2
   slow cores).

Latency = Job.first_started_at - Job.submitted_at, both stamped with the same clock (the bench
process stamps the submission, the worker the claim). The first `--warmup` submissions of each
phase are dropped (first task in each pool child, first publish from this process).

Afterwards each busy phase is checked from the Slice rows: how many submissions found every GPU
inside a busy-tier slice, and how many RT jobs started on a GPU whose previous slice was a busy
job's slice cut short (yielded) after the submission. For those, the latency splits into phases
that add up to it, from this process's own subscription to the signal channel and from the
JobEvent and Slice timestamps of the busy job P that made way:

    signal     submit transaction, COMMIT, publish of the dispatch message and of the RT signal,
               pub/sub delivery (to this process's subscriber; the worker's is in the next phase)
    step end   the worker's listener thread sets the flag; the running step (one sleep of
               --busy-step-ms) ends; the loop sees the flag and looks: queue lengths and freed
               GPUs (one Redis round trip), the order (queue heads, running jobs) and P's row
               (P's compute end - signal). If the
               signal came while P was still restoring (counted in the report), also the rest of
               the restore and one step. The split between signal and step end rests on this
               process's clock reading when its subscriber woke: under heavy load (large
               checkpoints on 2 CPUs) it wakes late and step end can read negative
    decide     the decision on that read, P's GPU marked free, CAS update (requeue)
    checkpoint P.checkpoint_ms: the snapshot (its copy into host memory is made in the background
               while the RT job starts) and its Redis mark; the write, fsync and rename are in the
               background, competing for the CPUs and the disk
    record     JobEvent and Slice inserts, up to P.ended_at
    hop+claim  COMMIT, publish of P's requeue message, task return and ack, BRPOP of the RT
               message, hand-off to the pool child, DB connection, claim read -> first_started_at

By default each GPU also has its standby RT lane (CLOCKQ_RT_LANE=on, workers/rt_lane.py),
started as `gpuworkers` starts it; `--no-rt-lane` measures RT through the checkpoint path
alone. With lanes, an RT job runs in a lane while the busy job pauses in
place (the synthetic jobs declare no GPU memory, and the RT jobs need none, so they fit), and the
report gives, per phase, the share of RT jobs served by pausing in place.

The report is one table (p50, p99, max; for each busy size also its p99 over the p99 behind the
smallest size), then the goals for every size of 64 MB or more: p99 <= 50 ms, and p99 <= 2x
the p99 behind the smallest size. Each goal line prints the figure, met or not.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import redis
from _harness import ROOT, Service, filesystem_of, percentile, private_clockq, start_gpu_worker, wait_for
from _rt_analysis import PHASES, BusyCheck, Phase, SignalLog, check_busy, collect

GOAL_MS = 50.0  # the specification's RT wait target
BUSY_STEPS = 1_000_000  # ~3 h at 10 ms: busy through any run; cancelled at the end of each size
RATIO_GOAL = 2.0  # p99 behind a large state <= this times the p99 behind the smallest
RATIO_GOAL_FROM_MB = 64  # the goals are judged for busy states of this size and more
MAX_STATE_MB = 1024  # the synthetic workload's state_kb limit


def wait_limit_s(base_s: float, state_mb: int) -> float:
    """A wait's time limit, grown with the busy state: half a second per MB, enough for several
    checkpoints and restores of that size on a slow 2-core machine (256 MB: base + 128 s)."""
    return base_s + 0.5 * state_mb


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=2, help="simulated GPUs (one worker each)")
    p.add_argument("--rt-jobs", type=int, default=100, help="RT submissions measured per phase")
    p.add_argument("--warmup", type=int, default=6, help="RT submissions dropped at the start of each phase")
    p.add_argument("--busy-tier", default="SP", choices=("HP", "SP", "BP", "BK"), help="tier of the busy jobs")
    p.add_argument("--busy-slice-ms", type=int, default=500, help="base and minimum slice of the busy tier")
    p.add_argument("--busy-step-ms", type=float, default=10.0, help="step length of the busy jobs")
    p.add_argument(
        "--busy-state-mb",
        type=int,
        nargs="+",
        default=[1, 64, 256, 1024],
        metavar="MB",
        help="checkpoint state of each busy job, in MiB: one busy phase per size, in this order",
    )
    p.add_argument(
        "--busy-gpu-util", type=float, default=0.45, help="utilisation the busy jobs declare (0.45: slice = base)"
    )
    p.add_argument("--gap-ms", type=float, nargs=2, default=(10.0, 50.0), metavar=("MIN", "MAX"), help="random gap")
    p.add_argument("--seed", type=int, default=1, help="seed of the random gaps")
    p.add_argument("--tmp-dir", type=Path, default=None, help="where the temporary directory goes")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, database)")
    p.add_argument(
        "--rt-lane",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a standby RT lane per GPU (CLOCKQ_RT_LANE, on by default); --no-rt-lane: RT through the checkpoint path",
    )
    args = p.parse_args(argv)
    if (
        args.gpus < 1
        or args.rt_jobs < 10
        or args.warmup < 0
        or args.busy_slice_ms < 1
        or args.busy_step_ms <= 0
        or not all(0 <= mb <= MAX_STATE_MB for mb in args.busy_state_mb)
        or len(set(args.busy_state_mb)) != len(args.busy_state_mb)
        or not 0 <= args.busy_gpu_util <= 1
        or not 0 <= args.gap_ms[0] <= args.gap_ms[1]
    ):
        p.error(
            "need --gpus >= 1, --rt-jobs >= 10, --warmup >= 0, positive slice and step, 0 <= MIN <= MAX gap, "
            f"--busy-state-mb sizes distinct, from 0 to {MAX_STATE_MB}"
        )
    return args


@dataclass
class BusyRun:
    """One busy phase: the busy jobs holding `state_mb` of state each, and the RT jobs behind them."""

    state_mb: int
    ids: list[int]  # the busy jobs, one per GPU
    phase: Phase
    ended_at: object  # datetime: when the RT sequence ended, before the busy jobs were cancelled
    check: BusyCheck | None = None
    lanes: dict[str, int] | None = None  # the RT jobs that lanes took in this phase, by path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    os.environ.pop("CLOCKQ_OVERHEAD_BUDGET", None)  # the default, whatever this shell has
    try:
        with private_clockq(
            "clockq-rt-latency-", tmp_dir=args.tmp_dir, keep=args.keep, CLOCKQ_GPUS=f"sim:{args.gpus}"
        ) as stack:
            logging.getLogger("clockq").setLevel(logging.WARNING)  # this process's submit and cancel logs
            from django.contrib.auth import get_user_model
            from django.utils import timezone

            from clockq.jobs.models import QueueTier

            QueueTier.objects.filter(code=args.busy_tier).update(
                base_slice_ms=args.busy_slice_ms, min_slice_ms=args.busy_slice_ms
            )
            # An RT job claimed after RT's start timeout (1 s) ends timed_out, unstarted: behind a
            # large checkpoint that happens, and its latency would be lost. The timeout is lifted
            # (before the workers read the tiers) and the report counts the starts past it.
            rt_timeout_ms = QueueTier.objects.get(code="RT").start_timeout_ms
            QueueTier.objects.filter(code="RT").update(start_timeout_ms=None)
            owner = get_user_model().objects.create_user("rt-latency-bench")
            stack.env["CLOCKQ_RT_LANE"] = "on" if args.rt_lane else "off"
            for index in range(args.gpus):
                stack.services.append(start_gpu_worker(index, args.gpus, stack.env, stack.work))
            workers = stack.services[1:]
            if args.rt_lane:
                stack.services += [start_rt_lane(index, args.gpus, stack.env, stack.work) for index in range(args.gpus)]
            signals = SignalLog(stack.broker_url)
            try:
                rng = random.Random(args.seed)
                served = lane_counts()
                idle = run_rt_sequence(args, "idle", owner, workers, rng, [], state_mb=0)
                idle_lanes, served = lane_delta(served)
                runs: list[BusyRun] = []
                for state_mb in args.busy_state_mb:
                    ids = start_busy_jobs(args, state_mb, owner, workers)
                    phase = run_rt_sequence(args, f"busy-{state_mb}mb", owner, workers, rng, ids, state_mb)
                    runs.append(BusyRun(state_mb, ids, phase, timezone.now()))
                    runs[-1].lanes, served = lane_delta(served)
                    stop_busy_jobs(ids, state_mb, workers)
                for phase in (idle, *(run.phase for run in runs)):
                    collect(phase, signals)
                for run in runs:
                    run.check = check_busy(args, run.phase, run.ids, run.ended_at, signals)
            finally:
                signals.stop()
    except (TimeoutError, RuntimeError, subprocess.SubprocessError) as exc:
        print(f"rt_latency: {exc}", file=sys.stderr)
        return 1

    report(args, stack.work, idle, runs, rt_timeout_ms, time.monotonic() - started)
    if args.rt_lane:
        report_lanes(args, idle_lanes, runs)
    return 0


def start_rt_lane(index: int, count: int, env: dict[str, str], work: Path, timeout: float = 90) -> Service:
    """GPU `index`'s standby RT lane, started as `gpuworkers` starts it; returns once it is idle."""
    from clockq.bus import lanes
    from clockq.bus.heartbeat import KEY_PREFIX
    from clockq.stack.roles import gpu_worker_argv, rt_lane_argv
    from workers.gpus import gpu_worker_env, simulated_gpus
    from workers.rt_lane import rt_lane_env

    gpu = simulated_gpus(count)[index]
    main_argv, argv = gpu_worker_argv(gpu.index), rt_lane_argv(gpu.index)
    main, hostname = main_argv[main_argv.index("--hostname") + 1], argv[argv.index("--hostname") + 1]
    client = redis.Redis.from_url(env["REDIS_URL"])
    client.delete(KEY_PREFIX + hostname)
    lane_env = {**env, **gpu_worker_env(gpu), **rt_lane_env(main)}
    lane = Service(f"RT lane {index}", argv, lane_env, ROOT, work / f"rt{index}-lane.log").start()

    def ready() -> bool:
        lane.check_alive()
        return bool(client.exists(KEY_PREFIX + hostname)) and client.zscore(lanes.IDLE_KEY, hostname) is not None

    try:
        wait_for(ready, timeout, f"RT lane {index} to be ready", interval=0.1)
    except BaseException:
        lane.stop()
        raise
    return lane


def lane_counts() -> dict[str, int]:
    from clockq.bus import lanes

    return lanes.served()


def lane_delta(before: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """The RT jobs lanes took since `before`, by path, and the counts now."""
    now = lane_counts()
    return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}, now


def report_lanes(args, idle: dict[str, int], runs: list[BusyRun]) -> None:
    n = args.warmup + args.rt_jobs

    def line(label: str, served: dict[str, int] | None) -> str:
        served = served or {}
        paused = served.get("pause", 0)
        rest = ", ".join(f"{k} {v}" for k, v in sorted(served.items()) if k != "pause") or "nothing else"
        return f"{label}: {paused}/{n} RT jobs served by pausing in place ({paused / n:.0%}); lanes took also: {rest}"

    print()
    print("RT lanes (warm-up submissions included):")
    print(line("  idle GPUs", idle))
    for run in runs:
        print(line(f"  behind {run.state_mb} MB", run.lanes))


# --- the runs -------------------------------------------------------------------------------


def rt_params():
    from clockq.jobs import workloads

    return workloads.validate("synthetic", {"steps": 1, "step_ms": 1.0, "state_kb": 0}, may_run_commands=False)


def run_rt_sequence(
    args, label: str, owner, workers: list[Service], rng: random.Random, busy_ids: list[int], state_mb: int
) -> Phase:
    """RT jobs one at a time; each waits for the one before to finish and the busy jobs to run."""
    from clockq.jobs.models import Job
    from clockq.jobs.services import submit_job

    params = rt_params()
    phase = Phase(label)

    def alive() -> None:
        for worker in workers:
            worker.check_alive()

    def busy_running() -> bool:
        alive()
        return Job.objects.filter(pk__in=busy_ids, state="running").count() == len(busy_ids)

    for i in range(args.warmup + args.rt_jobs):
        if busy_ids:
            wait_for(busy_running, wait_limit_s(30, state_mb), "every busy job to be running again", interval=0.005)
        time.sleep(rng.uniform(*args.gap_ms) / 1000)
        job = submit_job(owner=owner, name=f"rt-{label}-{i}", tier_code="RT", workload="synthetic", params=params)

        def finished(pk=job.pk) -> bool:
            alive()
            state = Job.objects.filter(pk=pk).values_list("state", flat=True).first()
            if state not in ("queued", "running", "succeeded"):
                raise RuntimeError(f"RT job {pk} ended {state}")
            return state == "succeeded"

        wait_for(finished, wait_limit_s(20, state_mb), f"RT job {job.pk} ({label}) to finish", interval=0.005)
        if i >= args.warmup:
            phase.ids.append(job.pk)
    return phase


def start_busy_jobs(args, state_mb: int, owner, workers: list[Service]) -> list[int]:
    """One long busy-tier job per GPU, all running (and past their first restore) on return."""
    from clockq.jobs import workloads
    from clockq.jobs.models import Job, Slice
    from clockq.jobs.services import submit_job

    params = workloads.validate(
        "synthetic",
        {
            "steps": BUSY_STEPS,
            "step_ms": args.busy_step_ms,
            "state_kb": state_mb * 1024,
            "gpu_util": args.busy_gpu_util,
        },
        may_run_commands=False,
    )
    ids = [
        submit_job(
            owner=owner, name=f"busy-{state_mb}mb-{i}", tier_code=args.busy_tier, workload="synthetic", params=params
        ).pk
        for i in range(args.gpus)
    ]
    limit_s = wait_limit_s(30, state_mb)

    def all_running() -> bool:
        for worker in workers:
            worker.check_alive()
        running = Job.objects.filter(pk__in=ids, state="running").values_list("worker", flat=True)
        return len(set(running)) == len(ids)

    wait_for(all_running, limit_s, f"a {state_mb} MB busy job running on every GPU", interval=0.05)
    # Let each finish its first (ordinary) slice, so that the measurement starts in steady state.
    wait_for(
        lambda: Slice.objects.filter(job_id__in=ids).count() >= len(ids),
        limit_s + 3 * args.busy_slice_ms / 1000,
        f"the {state_mb} MB busy jobs' first slices",
        interval=0.05,
    )
    wait_for(all_running, limit_s, f"a {state_mb} MB busy job running on every GPU", interval=0.05)
    return ids


def stop_busy_jobs(ids: list[int], state_mb: int, workers: list[Service]) -> None:
    """Cancel the busy jobs and wait until none runs: in the database at once; on the workers
    when each one that ran a busy job has logged that it stopped it (at its next step, or after
    a restore in progress). Then the GPUs are idle."""
    from clockq.jobs.models import Job, JobEvent
    from clockq.jobs.services import ActionRefused, cancel_job

    for job in Job.objects.filter(pk__in=ids):
        with contextlib.suppress(ActionRefused):
            cancel_job(job, actor="rt-latency-bench")
    # The ones a worker was running when the cancel landed (a queued one has nothing to stop).
    was_running = set(
        JobEvent.objects.filter(job_id__in=ids, from_state="running", to_state="cancelled").values_list(
            "job_id", flat=True
        )
    )
    limit_s = wait_limit_s(30, state_mb)

    def idle() -> bool:
        for worker in workers:
            worker.check_alive()
        return not Job.objects.filter(state="running").exists()

    wait_for(idle, limit_s, f"the GPUs to go idle after cancelling the {state_mb} MB busy jobs", interval=0.05)

    def stopped_on_workers() -> bool:
        logs = "".join(w.log_path.read_text(errors="replace") for w in workers)
        return all(f"job {pk}: stopping" in logs for pk in was_running)

    wait_for(stopped_on_workers, limit_s, f"the workers to stop the {state_mb} MB busy jobs", interval=0.05)


# --- report ---------------------------------------------------------------------------------


def p99(values: list[float]) -> float:
    return percentile(sorted(values), 99)


def stats_row(label: str, values: list[float], ratio: float | None = None, late: int | None = None) -> str:
    """n, p50, p99, max; then, where given, p99 over the smallest size's p99 and the starts past
    RT's start timeout."""
    data = sorted(values)
    if not data:
        return f"{label:<30}{0:>5}"
    row = f"{label:<30}{len(data):>5}{percentile(data, 50):>9.1f}{percentile(data, 99):>9.1f}{data[-1]:>9.1f}"
    row += f"{ratio:>10.2f}x" if ratio is not None else " " * 11
    return (row + (f"{late:>12}" if late is not None else "")).rstrip()


def report(args, work: Path, idle: Phase, runs: list[BusyRun], rt_timeout_ms: int | None, elapsed_s: float) -> None:
    import celery
    import django

    tier = args.busy_tier
    sizes = ", ".join(f"{run.state_mb}" for run in runs)
    print(
        f"RT submit-to-start latency: {args.gpus} simulated GPU workers (prefork, concurrency 1), private "
        f"redis-server, SQLite; busy load: one {tier} job per GPU, {args.busy_step_ms:g} ms steps, "
        f"state {sizes} MB (one phase each), {tier} slice {args.busy_slice_ms} ms, CLOCKQ_OVERHEAD_BUDGET "
        f"default; {args.rt_jobs} RT jobs per phase (after {args.warmup} warm-up), 1 step x 1 ms, gaps "
        f"{args.gap_ms[0]:g}-{args.gap_ms[1]:g} ms; {os.cpu_count()} CPUs; checkpoints on "
        f"{filesystem_of(work.parent)}; Python {sys.version.split()[0]}, Celery {celery.__version__}, "
        f"Django {django.__version__}; {elapsed_s:.0f} s"
    )
    print()
    smallest = min(runs, key=lambda run: run.state_mb)
    base_p99 = p99(smallest.phase.latencies)
    timeout_ms = float("inf") if rt_timeout_ms is None else rt_timeout_ms

    def late(phase: Phase) -> int:
        return sum(1 for value in phase.latencies if value > timeout_ms)

    print(
        f"{'ms':<30}{'n':>5}{'p50':>9}{'p99':>9}{'max':>9}{f'p99/{smallest.state_mb}MB':>11}{f'>{rt_timeout_ms}ms':>12}"
    )
    print(stats_row("RT on idle GPUs", idle.latencies, late=late(idle)))
    for run in runs:
        check = run.check
        ratio = p99(run.phase.latencies) / base_p99
        print(stats_row(f"RT behind {run.state_mb} MB {tier} jobs", run.phase.latencies, ratio, late(run.phase)))
        for name in PHASES:
            print(stats_row(f"  {name}", check.phases.get(name, [])))
    print()
    print(
        "(breakdown: the RT jobs that preempted a busy job, whose phases add up to their latency; "
        "step end includes the rest of the restore when the signal came while that job was restoring)"
    )
    print(
        f"(>{rt_timeout_ms}ms: starts past RT's start timeout, lifted for this run so that they are measured; "
        "with it, those RT jobs would have ended timed_out, unstarted)"
    )
    for run in runs:
        check, n = run.check, len(run.phase.ids)
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(check.busy_slices.items()))
        followed = ", ".join(f"{k} {v}" for k, v in check.after_yield.most_common())
        lo, hi = (check.planned_ms[0], check.planned_ms[-1]) if check.planned_ms else (0, 0)
        planned = f"{lo}" if lo == hi else f"{lo}-{hi}"
        print(
            f"busy {run.state_mb} MB: all {args.gpus} GPUs busy at {check.all_busy_at_submit}/{n} submissions; "
            f"{check.preempted}/{n} RT jobs preempted a {tier} slice ({len(check.phases.get(PHASES[0], []))} split, "
            f"{check.during_restore} of them signalled during its restore); {tier} slices: {outcomes} "
            f"({check.cut_short} cut short), {check.yields_per_rt:.2f} yields per RT job, planned {planned} ms "
            f"({check.plan_reasons}); next after a yield: {followed}; "
            f"RT jobs per GPU {dict(sorted(run.phase.gpus.items()))}"
        )
    print()
    judged = [run for run in runs if run.state_mb >= RATIO_GOAL_FROM_MB]
    if not judged:
        print(f"goals: no busy state of {RATIO_GOAL_FROM_MB} MB or more in this run, nothing judged")
    for run in judged:
        value = p99(run.phase.latencies)
        verdict = "met" if value <= GOAL_MS else "NOT met"
        print(f"goal, behind {run.state_mb} MB: p99 <= {GOAL_MS:g} ms: {verdict} (p99 {value:.1f} ms)")
        limit = RATIO_GOAL * base_p99
        verdict = "met" if value <= limit else "NOT met"
        print(
            f"goal, behind {run.state_mb} MB: p99 <= {RATIO_GOAL:g}x the p99 behind {smallest.state_mb} MB: {verdict} "
            f"(p99 {value:.1f} ms vs {RATIO_GOAL:g} x {base_p99:.1f} = {limit:.1f} ms; {value / base_p99:.2f}x)"
        )


if __name__ == "__main__":
    sys.exit(main())
