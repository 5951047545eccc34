"""How fast the trace replay runs: 100,000 jobs on 1,000 GPUs, every policy, against fifo.

Usage (from the repository root):

    .venv/bin/python bench/replay_speed.py [--jobs 100000] [--gpus 1000] [--load 0.9]

The trace is GENERATED, not real: jobs drawn (seeded) from the Alibaba OpenB pod list in
../shared/data/jobs (its tiers, GPU counts, run times and GPU shares, after the replay's own
mapping), arriving as a Poisson process whose rate gives `--load` (offered GPU demand over
capacity) on `--gpus` GPUs. The goal: the clockq replay of 100,000 jobs on 1,000
GPUs in under 60 s on a 2-core machine. fifo, which does the least work per job (no slices, no
preemption), runs on the same trace in the same process as the baseline: the ratio is what
compares across machines.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clockq.replay import report, traces
from clockq.replay.config import Config
from clockq.replay.model import Trace
from clockq.replay.policies import POLICIES, replay

ALIBABA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "jobs" / "alibaba_openb2023_pods.csv"
GOAL_S = 60.0


def generated_trace(jobs: int, gpus: int, load: float, seed: int, slack: float = 2.0) -> Trace:
    source = traces.load(str(ALIBABA), "alibaba", slack=slack)
    rng = random.Random(seed)
    drawn = [rng.choice(source.jobs) for _ in range(jobs)]
    # The arrival window W where the GPU-time the jobs ask for within it (a job longer than W
    # counts W) is `load` of the capacity: a few jobs run for months, so the plain mean would
    # leave the window nearly empty of contention.
    low, high = 1.0, 1e12
    for _ in range(200):
        window = (low * high) ** 0.5
        demand = sum(min(j.duration_s, window) * j.num_gpu for j in drawn)
        low, high = (window, high) if demand > load * gpus * window else (low, window)
    rate = jobs / window  # arrivals per second
    now, out = 0.0, []
    for i, j in enumerate(drawn):
        now += rng.expovariate(rate)
        deadline = None if j.deadline_s is None else now + (j.deadline_s - j.submit_s)
        out.append(replace(j, key=f"g{i}", line=i + 2, submit_s=now, deadline_s=deadline))
    return Trace(f"generated from {ALIBABA.name} ({jobs} jobs, load {load})", out, mapping=source.mapping)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--gpus", type=int, default=1_000)
    parser.add_argument("--load", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policy", default=",".join(POLICIES))
    args = parser.parse_args()

    t0 = time.perf_counter()
    trace = generated_trace(args.jobs, args.gpus, args.load, args.seed)
    print(
        f"{trace.name}: {len(trace.jobs)} jobs over {trace.jobs[-1].submit_s / 86400:.1f} days, "
        f"{args.gpus} GPUs (made in {time.perf_counter() - t0:.1f} s)"
    )
    config = Config(gpus=args.gpus, seed=args.seed)
    runs = []
    for policy in args.policy.split(","):
        run = replay(trace, policy, config)
        runs.append(run)
        print(f"  {policy:9s} {run.wall_s:6.1f} s  {run.events:>10,} events  {run.events / run.wall_s:>9,.0f} events/s")
    base = next((r for r in runs if r.policy == "fifo"), None)
    print()
    print(f"{'policy':9s} {'wall':>8s} {'x fifo':>8s} {'goal':>8s}")
    for run in runs:
        ratio = f"{run.wall_s / base.wall_s:.1f}" if base else "-"
        verdict = "met" if run.wall_s < GOAL_S else "MISSED"
        print(f"{run.policy:9s} {run.wall_s:7.1f}s {ratio:>8s} {verdict:>8s}")
    print()
    print(report.table([report.summarize(run) for run in runs]))


if __name__ == "__main__":
    main()
