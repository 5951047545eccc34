"""Fair share between users, replayed: one user's burst of jobs against a few jobs of many others.

Usage (from the repository root):

    .venv/bin/python bench/fair_share.py [--gpus 32] [--burst 500] [--users 10] [--seed 1]

The trace is GENERATED, not real: every job is SP (one tier, so only the order within a tier
tells the users apart) on one GPU, with log-normal run times around 20 minutes. One user
submits `--burst` jobs within the first minute; `--users` other users submit three jobs each
at random times over the next two hours, behind that backlog. A policy with fair share between
users (clockq: the user's recent service in the tier orders a tier's jobs of one service level)
serves the few users' jobs before the burst's; FIFO serves them after it; LAS (no users) serves
them when their attained service says so. Printed: each group's waits and completion times
under each policy, and the light users' mean JCT against each baseline's.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clockq.replay import report
from clockq.replay.config import Config
from clockq.replay.model import RunResult, Trace, TraceJob
from clockq.replay.policies import POLICIES, replay

MEDIAN_RUN_S = 20 * 60.0
STATE_MB = 100.0


def trace(*, burst: int, users: int, seed: int) -> Trace:
    rng = random.Random(seed)

    def job(key: str, submit_s: float, user: str) -> TraceJob:
        run_s = MEDIAN_RUN_S * rng.lognormvariate(0.0, 0.5)
        return TraceJob(key, 0, submit_s, run_s, 1, "SP", None, STATE_MB, user=user)

    jobs = [job(f"burst-{i}", rng.uniform(0, 60), "heavy") for i in range(burst)]
    for u in range(users):
        jobs += [job(f"light{u}-{k}", rng.uniform(60, 2 * 3600), f"light{u}") for k in range(3)]
    jobs.sort(key=lambda j: (j.submit_s, j.key))
    return Trace("fair share (generated)", jobs)


def group(run: RunResult, light: bool) -> dict[str, float | None]:
    mine = [r for r in run.jobs if (r.job.user != "heavy") == light]
    waits = [w for r in mine if (w := report.wait_s(r)) is not None]
    jcts = [r.jct_s for r in mine if r.jct_s is not None]
    return {
        "jobs": len(mine),
        "wait_mean": report.mean(waits),
        "wait_p95": report.quantile(waits, report.P95),
        "jct_mean": report.mean(jcts),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=32)
    parser.add_argument("--burst", type=int, default=500, help="jobs of the one heavy user")
    parser.add_argument("--users", type=int, default=10, help="light users, three jobs each")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.gpus < 1 or args.burst < 0 or args.users < 1:
        parser.error("--gpus and --users must be at least 1, --burst at least 0")
    jobs = trace(burst=args.burst, users=args.users, seed=args.seed)
    runs = {p: replay(jobs, p, Config(gpus=args.gpus)) for p in POLICIES}
    t = report.human_s
    print(
        f"{args.burst} jobs of one user in the first minute, {args.users} users x 3 jobs over 2 h, "
        f"all SP on one GPU each, {args.gpus} GPUs, seed {args.seed}\n"
    )
    print("| policy | light users: mean wait | p95 wait | mean JCT | heavy user: mean wait | mean JCT |")
    print("|---|---|---|---|---|---|")
    light = {}
    for name, run in runs.items():
        lg, hv = group(run, light=True), group(run, light=False)
        light[name] = lg
        print(
            f"| {name} | {t(lg['wait_mean'])} | {t(lg['wait_p95'])} | {t(lg['jct_mean'])} "
            f"| {t(hv['wait_mean'])} | {t(hv['jct_mean'])} |"
        )
    mine = light["clockq"]["jct_mean"]
    print()
    for name in ("fifo", "priority", "las"):
        theirs = light[name]["jct_mean"]
        if mine is not None and theirs:
            print(f"light users' mean JCT, clockq / {name}: {mine / theirs:.3f}")


if __name__ == "__main__":
    main()
