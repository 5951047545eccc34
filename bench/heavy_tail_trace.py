"""Write a GENERATED job trace with heavy-tailed run times, as a plain clockq CSV.

Usage (from the repository root):

    .venv/bin/python bench/heavy_tail_trace.py OUT.csv [--jobs 3000] [--gpus 32] [--load 0.9] [--seed 7]

Not real data: a trace for judging a policy on what the shared traces don't show, drawn from
distributions that published GPU-cluster studies describe (Philly, Helios, Alibaba PAI):

- run times follow a Pareto law (shape 1.3: a few jobs hold most of the GPU time), scaled per
  tier from seconds (RT inference) to hours (experiments);
- most jobs take one GPU, some 2, 4 or 8 (gangs); RT takes one;
- eight users per tier with Zipf-like shares, so one user submits about a third of a tier;
- state sizes are log-normal around 100 MB (RT's around 10 MB);
- arrivals are a Poisson process whose rate gives `--load`: the GPU-time asked for within the
  arrival window (a job longer than the window counts the window) over the capacity in it, the
  definition bench/replay_kpis.py reports.

The same seed gives the same file. The CSV has no deadlines: the loader derives them from each
tier's wait target and the slack, as for the real traces.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
from dataclasses import dataclass

# tier: (share of jobs, Pareto minimum run time in s, cap in s)
TIER_MIX = {
    "RT": (0.15, 0.5, 600.0),
    "HP": (0.20, 60.0, 86_400.0),
    "SP": (0.30, 300.0, 7 * 86_400.0),
    "BP": (0.20, 600.0, 14 * 86_400.0),
    "BK": (0.15, 600.0, 14 * 86_400.0),
}
PARETO_SHAPE = 1.3
GANGS = ((1, 0.80), (2, 0.08), (4, 0.07), (8, 0.05))
USERS_PER_TIER = 8


@dataclass(frozen=True)
class Row:
    job_id: str
    submit_time: float
    duration: float
    num_gpu: int
    tier: str
    checkpoint_mb: float
    user: str


def _draw(rng: random.Random, jobs: int) -> list[Row]:
    tiers = list(TIER_MIX)
    weights = [TIER_MIX[t][0] for t in tiers]
    user_weights = [1 / (k + 1) for k in range(USERS_PER_TIER)]
    rows = []
    for i in range(jobs):
        tier = rng.choices(tiers, weights)[0]
        _, low, cap = TIER_MIX[tier]
        duration = min(low * rng.random() ** (-1 / PARETO_SHAPE), cap)
        gpus = 1 if tier == "RT" else rng.choices([g for g, _ in GANGS], [w for _, w in GANGS])[0]
        state = rng.lognormvariate(math.log(10.0 if tier == "RT" else 100.0), 0.8)
        user = f"{tier.lower()}-user{rng.choices(range(USERS_PER_TIER), user_weights)[0]}"
        rows.append(Row(f"h{i}", 0.0, round(duration, 3), gpus, tier, round(state, 1), user))
    return rows


def generate(*, jobs: int, gpus: int, load: float, seed: int) -> list[Row]:
    if jobs < 1 or gpus < 1 or not load > 0:
        raise ValueError("jobs and gpus must be at least 1 and the load positive")
    rng = random.Random(seed)
    rows = _draw(rng, jobs)
    # The window whose offered load is `load`, by bisection (demand within it grows slower
    # than the window because long jobs are cut at its length).
    low, high = 1.0, 1e12
    for _ in range(200):
        window = (low * high) ** 0.5
        demand = sum(min(r.duration, window) * r.num_gpu for r in rows)
        low, high = (window, high) if demand > load * gpus * window else (low, window)
    rate = jobs / window
    now, out = 0.0, []
    for r in rows:
        now += rng.expovariate(rate)
        out.append(Row(r.job_id, round(now, 3), r.duration, r.num_gpu, r.tier, r.checkpoint_mb, r.user))
    return out


def write(path: str, *, jobs: int = 3000, gpus: int = 32, load: float = 0.9, seed: int = 7) -> None:
    rows = generate(jobs=jobs, gpus=gpus, load=load, seed=seed)
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["job_id", "submit_time", "duration", "num_gpu", "tier", "checkpoint_mb", "user"])
        for r in rows:
            out.writerow([r.job_id, r.submit_time, r.duration, r.num_gpu, r.tier, r.checkpoint_mb, r.user])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--gpus", type=int, default=32)
    parser.add_argument("--load", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    write(args.out, jobs=args.jobs, gpus=args.gpus, load=args.load, seed=args.seed)


if __name__ == "__main__":
    main()
