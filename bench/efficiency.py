"""Useful-work efficiency: the share of a busy GPU's time spent in job steps when two jobs share it.

Usage (from the repository root):

    .venv/bin/python bench/efficiency.py [--steps 400] [--step-ms 5] [--state-kb 1024] [--repeats 1]

Everything runs privately and is stopped and deleted at the end: a redis-server on a free port,
a fresh SQLite file, temporary checkpoint and var directories, and one simulated GPU worker per
configuration (started as `gpuworkers` starts it, so each configuration gets its own settings).

Two synthetic SP jobs (`--steps` steps of `--step-ms` each, `--state-kb` of checkpoint state) are
submitted together to one GPU, in four configurations, each on a fresh worker:

    baseline    SP base = min slice = 600000 ms: each job runs in one slice, one after the
                other, with no slicing (one job-to-job hop, as any queue has)
    50 ms       base = min = 50 ms, CLOCKQ_OVERHEAD_BUDGET=0
    20 ms       base = min = 20 ms, CLOCKQ_OVERHEAD_BUDGET=0
    20 ms+rule  base = min = 20 ms, CLOCKQ_OVERHEAD_BUDGET=0.05: the planner stretches each
                job's slices to switch_cost / 0.05 once it has measured a switch

Jobs of one class never displace one another (clockq/policy/ordering.py), so each configuration's
service ladder has a rung every 0.9 slice (`_harness.turn_ladder`): the two jobs take turns about
every other boundary (A B B A A ...), and the report counts the switches. The baseline's rungs are
minutes apart, so its jobs run one after the other.

The jobs declare `--gpu-util` (default 0.45), for which the specification's slice formula gives
exactly the base slice (0.8 + 0.4 * 0.45 / 0.9 = 1.0), so the slices are the length asked for.

    useful work = sum over all slices of (Slice.used_ms + 0.5)  (used_ms is stored truncated)
    busy wall   = last Slice.ended_at - first Slice.started_at, across both jobs
    efficiency  = useful work / busy wall

`nominal` is the same with steps x step_ms as the useful work (time.sleep overshoots a little,
so it reads slightly lower). A switch is a yielded slice followed by the other job's slice; its
gap is the GPU's idle time between the two jobs' computations, as in bench/switch_cost.py:

    gap = (B.started_at + B.restore_ms) - (A.started_at + A.restore_ms + A.used_ms + 0.5)
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import logging
import math
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from _harness import filesystem_of, private_clockq, start_gpu_worker, turn_ladder, wait_for

HALF_MS_TRUNCATION = 0.5  # Slice.used_ms is stored as int(ms)
BASELINE_SLICE_MS = 600_000
# A switch's gap, in the order things happen (JobEvent and Slice timestamps; they add up to the gap):
PHASES = ("decide", "checkpoint", "record", "hop+claim", "start", "restore")
PHASE_HELP = (
    "decide: boundary read of the job row, queue lengths (LLEN), DB confirm, CAS update of the requeue; "
    "checkpoint: A.checkpoint_ms (snapshot into host memory, its Redis mark; the write is in the background); "
    "record: JobEvent, metric and Slice writes; "
    "hop+claim: COMMIT, publish of A's requeue message, task return and ack, BRPOP of B's message, hand-off to "
    "the pool child, B's claim read and CAS update; start: JobEvent, COMMIT, tier read up to B.started_at; "
    "restore: B.restore_ms (0 on a warm resume)"
)
# The specification's efficiency goals at 50 and 20 ms slices; with the overhead rule on, what
# the budget (0.05) promises.
GOALS = {"50 ms": 0.95, "20 ms": 0.90, "20 ms+rule": 0.95}


@dataclass(frozen=True)
class Config:
    label: str
    slice_ms: int
    budget: str  # CLOCKQ_OVERHEAD_BUDGET for the worker


CONFIGS = (
    Config("baseline", BASELINE_SLICE_MS, "0"),
    Config("50 ms", 50, "0"),
    Config("20 ms", 20, "0"),
    Config("20 ms+rule", 20, "0.05"),
)


@dataclass
class Result:
    config: Config
    efficiency: float
    nominal: float
    shared: float  # efficiency up to the end of the first job to finish (both jobs present)
    useful_ms: float
    wall_ms: float
    slices: int
    switches: int
    gaps: list[float]  # ms, one per switch
    planned_median: float  # ms, the planner's slice length (median over slices)
    plan_reasons: str
    switch_cost_ms: list[float]  # the planner's per-job switch cost estimate (Job.switch_cost_ms)
    phases: dict[str, list[float]]  # ms, the gap of each switch split as PHASES (they add up to it)

    @property
    def gap_median(self) -> float:
        return statistics.median(self.gaps) if self.gaps else float("nan")

    @property
    def lost_per_switch(self) -> float:
        return (self.wall_ms - self.useful_ms) / self.switches if self.switches else float("nan")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=400, help="steps per job (400 x 5 ms gives ~200 switches at 20 ms)")
    p.add_argument("--step-ms", type=float, default=5.0, help="synthetic step length (simulated kernel)")
    p.add_argument("--state-kb", type=int, default=1024, help="checkpoint state per job, in KiB")
    p.add_argument("--gpu-util", type=float, default=0.45, help="utilisation the jobs declare (0.45: slice = base)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each configuration")
    p.add_argument("--tmp-dir", type=Path, default=None, help="where the temporary directory goes")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, database)")
    args = p.parse_args(argv)
    if args.steps < 10 or args.step_ms <= 0 or args.state_kb < 0 or args.repeats < 1 or not 0 <= args.gpu_util <= 1:
        p.error("need --steps >= 10, --step-ms > 0, --state-kb >= 0, --repeats >= 1, 0 <= --gpu-util <= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results: list[Result] = []
    started = time.monotonic()
    try:
        with private_clockq("clockq-efficiency-", tmp_dir=args.tmp_dir, keep=args.keep, CLOCKQ_GPUS="sim:1") as stack:
            logging.getLogger("clockq").setLevel(logging.WARNING)  # this process's submit logs
            from django.contrib.auth import get_user_model

            owner = get_user_model().objects.create_user("efficiency-bench")
            for repeat, config in itertools.product(range(args.repeats), CONFIGS):
                results.append(run_config(args, config, repeat, owner, stack.env, stack.work, stack.services))
    except (TimeoutError, RuntimeError, subprocess.SubprocessError) as exc:
        print(f"efficiency: {exc}", file=sys.stderr)
        return 1
    report(args, stack.work, results, time.monotonic() - started)
    return 0


def run_config(args, config: Config, repeat: int, owner, env: dict[str, str], work: Path, services) -> Result:
    from clockq.jobs import workloads
    from clockq.jobs.models import Job, JobEvent, QueueTier, Slice
    from clockq.jobs.services import submit_job

    # Before the worker starts: its tier cache and its settings are read fresh.
    QueueTier.objects.filter(code="SP").update(base_slice_ms=config.slice_ms, min_slice_ms=config.slice_ms)
    # The two jobs take turns only when their services part by a rung (turn_ladder): with the
    # default ladder neither would make way for the other, and no slice would be a switch.
    ladder = turn_ladder(config.slice_ms, math.ceil(args.steps * args.step_ms / config.slice_ms) + 3)
    worker = start_gpu_worker(
        0, 1, {**env, "CLOCKQ_OVERHEAD_BUDGET": config.budget, "CLOCKQ_SERVICE_LADDER_S": ladder}, work
    )
    services.append(worker)
    try:
        params = workloads.validate(
            "synthetic",
            {"steps": args.steps, "step_ms": args.step_ms, "state_kb": args.state_kb, "gpu_util": args.gpu_util},
            may_run_commands=False,
        )
        ids = [
            submit_job(
                owner=owner,
                name=f"eff-{config.label}-{repeat}-{x}",
                tier_code="SP",
                workload="synthetic",
                params=params,
            ).pk
            for x in "ab"
        ]

        def finished() -> bool:
            worker.check_alive()
            return not Job.objects.filter(pk__in=ids, state__in=["queued", "running"]).exists()

        # Generous: the work itself, plus up to 50 ms per 20 ms slice of switching.
        expected_s = 2 * args.steps * args.step_ms / 1000 * (1 + 50 / min(config.slice_ms, 20))
        wait_for(finished, 60 + 2 * expected_s, f"the {config.label} jobs to finish", interval=0.2)
    finally:
        worker.stop()
        services.remove(worker)

    states = dict(Job.objects.filter(pk__in=ids).values_list("pk", "state"))
    if any(state != "succeeded" for state in states.values()):
        raise RuntimeError(f"{config.label}: jobs did not succeed: {states}; worker log:\n{worker.tail()}")
    slices = list(
        Slice.objects.filter(job_id__in=ids)
        .order_by("started_at", "id")
        .values(
            "job_id",
            "started_at",
            "ended_at",
            "used_ms",
            "steps",
            "outcome",
            "restore_ms",
            "planned_ms",
            "checkpoint_ms",
        )
    )
    events = JobEvent.objects.filter(job_id__in=ids).values_list("job_id", "from_state", "to_state", "at")
    reasons = Slice.objects.filter(job_id__in=ids).values_list("plan_reason", flat=True)
    costs = [c for c in Job.objects.filter(pk__in=ids).values_list("switch_cost_ms", flat=True) if c is not None]
    return measure(config, slices, list(events), args.step_ms, sorted(set(reasons)), costs)


def measure(
    config: Config, slices: list[dict], events: list[tuple], step_ms: float, reasons: list[str], costs: list[float]
) -> Result:
    useful = sum(s["used_ms"] + HALF_MS_TRUNCATION for s in slices)
    nominal = sum(s["steps"] for s in slices) * step_ms
    wall = ms(max(s["ended_at"] for s in slices) - slices[0]["started_at"])
    # While both jobs are unfinished: up to the end of the first job's last slice.
    first_done = min(s["ended_at"] for s in slices if s["outcome"] == "completed")
    shared = [s for s in slices if s["ended_at"] <= first_done]
    shared_eff = sum(s["used_ms"] + HALF_MS_TRUNCATION for s in shared) / ms(first_done - slices[0]["started_at"])
    yields: dict[int, list[float]] = defaultdict(list)
    claims: dict[int, list[float]] = defaultdict(list)
    for job_id, src, dst, at in sorted(events, key=lambda e: e[3]):
        if (src, dst) == ("running", "queued"):
            yields[job_id].append(at.timestamp() * 1000)
        elif (src, dst) == ("queued", "running"):
            claims[job_id].append(at.timestamp() * 1000)
    gaps: list[float] = []
    phases: dict[str, list[float]] = defaultdict(list)
    for a, b in itertools.pairwise(slices):
        if a["outcome"] != "yielded" or a["job_id"] == b["job_id"]:
            continue
        a_start, a_end = a["started_at"].timestamp() * 1000, a["ended_at"].timestamp() * 1000
        b_start = b["started_at"].timestamp() * 1000
        compute_end = a_start + a["restore_ms"] + a["used_ms"] + HALF_MS_TRUNCATION
        gaps.append(b_start + b["restore_ms"] - compute_end)
        yielded_at = first_between(yields[a["job_id"]], a_start, a_end)
        claimed_at = first_between(claims[b["job_id"]], a_end, b_start)
        if yielded_at is None or claimed_at is None:
            continue
        for name, value in zip(
            PHASES,
            (
                yielded_at - compute_end - a["checkpoint_ms"],
                a["checkpoint_ms"],
                a_end - yielded_at,
                claimed_at - a_end,
                b_start - claimed_at,
                b["restore_ms"],
            ),
            strict=True,
        ):
            phases[name].append(value)
    return Result(
        config=config,
        efficiency=useful / wall,
        nominal=nominal / wall,
        shared=shared_eff,
        useful_ms=useful,
        wall_ms=wall,
        slices=len(slices),
        switches=len(gaps),
        gaps=gaps,
        planned_median=statistics.median(s["planned_ms"] for s in slices),
        plan_reasons="/".join(reasons),
        switch_cost_ms=costs,
        phases=dict(phases),
    )


def first_between(times: list[float], lo: float, hi: float) -> float | None:
    i = bisect.bisect_left(times, lo)
    return times[i] if i < len(times) and times[i] <= hi else None


def ms(delta) -> float:
    return delta.total_seconds() * 1000


# --- report ---------------------------------------------------------------------------------


def report(args, work: Path, results: list[Result], elapsed_s: float) -> None:
    import celery
    import django

    print(
        f"useful-work efficiency: 2 synthetic SP jobs x {args.steps} steps x {args.step_ms:g} ms, "
        f"{args.state_kb} KB state, one simulated GPU worker (prefork, concurrency 1), private redis-server, "
        f"SQLite; {os.cpu_count()} CPUs; checkpoints on {filesystem_of(work.parent)}; Python "
        f"{sys.version.split()[0]}, Celery {celery.__version__}, Django {django.__version__}; {elapsed_s:.0f} s"
    )
    print()
    header = (
        f"{'config':<12}{'run':>4}{'planned':>9}{'slices':>7}{'switches':>9}{'gap med':>9}{'gap p90':>9}"
        f"{'lost/sw':>9}{'useful s':>9}{'wall s':>8}{'effic.':>8}{'nominal':>8}{'shared':>8}{'vs base':>8}"
    )
    print(header)
    by_repeat = [results[i : i + len(CONFIGS)] for i in range(0, len(results), len(CONFIGS))]
    for repeat, runs in enumerate(by_repeat, 1):
        base = runs[0].efficiency
        for r in runs:
            planned = "one" if r.config.slice_ms == BASELINE_SLICE_MS else f"{r.planned_median:.0f}"
            gaps = sorted(r.gaps)
            p90 = gaps[min(len(gaps) - 1, math.ceil(0.9 * len(gaps)) - 1)] if gaps else float("nan")
            print(
                f"{r.config.label:<12}{repeat:>4}{planned:>9}{r.slices:>7}{r.switches:>9}{r.gap_median:>9.2f}"
                f"{p90:>9.2f}{r.lost_per_switch:>9.2f}{r.useful_ms / 1000:>9.3f}{r.wall_ms / 1000:>8.3f}"
                f"{r.efficiency:>8.1%}{r.nominal:>8.1%}{r.shared:>8.1%}{r.efficiency / base:>8.3f}"
            )
    print()
    print(
        "planned: the planner's slice (median, ms); gap: GPU idle between the two jobs' computations at a switch "
        "(ms); lost/sw: (wall - useful) / switches (ms); effic.: sum(used_ms) / busy wall; nominal: "
        "steps x step_ms / busy wall; shared: effic. up to the end of the first job to finish (no solo tail)"
    )
    print()
    print(f"{'switch gap, median ms':<24}" + "".join(f"{name:>11}" for name in (*PHASES, "gap")))
    for config in CONFIGS[1:]:
        runs = [r for r in results if r.config == config]
        pooled = {name: [v for r in runs for v in r.phases.get(name, [])] for name in PHASES}
        gaps = [g for r in runs for g in r.gaps]
        cells = [statistics.median(v) if v else float("nan") for v in (*pooled.values(), gaps)]
        print(f"{config.label:<24}" + "".join(f"{c:>11.2f}" for c in cells))
    print(f"  ({PHASE_HELP})")
    print()
    rule = [r for r in results if r.config.budget != "0"]
    for r in rule:
        costs = ", ".join(f"{c:.1f}" for c in r.switch_cost_ms)
        print(
            f"20 ms+rule: plan reasons {r.plan_reasons}; the planner's switch cost estimate per job {costs} ms "
            f"-> slice >= cost / 0.05; measured gap median {r.gap_median:.1f} ms; efficiency while both jobs "
            f"ran {r.shared:.1%}"
        )
    print()
    summary = []
    for config in CONFIGS:
        effs = [r.efficiency for r in results if r.config == config]
        ratios = [r.efficiency / runs[0].efficiency for runs in by_repeat for r in runs if r.config == config]
        value = statistics.median(effs)
        spread = f" ({min(effs):.1%}-{max(effs):.1%})" if len(effs) > 1 else ""
        line = f"{config.label:<12} efficiency {value:.1%}{spread}, {statistics.median(ratios):.3f} of baseline"
        goal = GOALS.get(config.label)
        if goal is not None:
            line += f"; goal >= {goal:.0%}: {'met' if value >= goal else 'NOT met'}"
        print(line)
        summary.append(
            f"{config.label} {value:.1%}" + (f" ({statistics.median(ratios):.3f}x)" if config is not CONFIGS[0] else "")
        )
    print()
    print("efficiency (median of runs; sliced/baseline): " + " | ".join(summary))


if __name__ == "__main__":
    sys.exit(main())
