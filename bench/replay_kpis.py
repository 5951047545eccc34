"""Replay job traces under fifo, priority, las and clockq, and judge clockq's goals against them.

Usage (from the repository root; bench/replay_kpis.sh runs it, then the simulator's speed):

    .venv/bin/python bench/replay_kpis.py [--markdown] [--seed N] [--quick]

The traces: the two shared real ones (the Tiresias trace at two cluster sizes, the Alibaba
OpenB pods), and a GENERATED heavy-tailed trace (bench/heavy_tail_trace.py) at offered loads
0.9 and 1.44, drawn afresh from `--seed`: a policy tuned to the shared files meets a trace it
has not seen. For each: the four policies side by side, the same with every switch costing
twice as much (not with --quick), and the goals, each judged against the baselines of the same
run. Then clockq again with admission control on (clockq/replay/admission.py: the live
control loop's rules on a persistence forecast), once holding what the default holds (only jobs
that would wait anyway) and once holding every tier but RT, against clockq without it. The run
ends with a table of every goal on every trace, and one of what admission control changed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import heavy_tail_trace

from clockq.policy import control
from clockq.replay import report, traces
from clockq.replay.config import Config, SwitchCost
from clockq.replay.model import RunResult
from clockq.replay.policies import POLICIES, replay

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "jobs"
SHARED_CASES = [
    # name, file, format, GPUs
    ("Tiresias, 16 GPUs", "tiresias_60_jobs.csv", "tiresias", 16),
    ("Tiresias, 8 GPUs", "tiresias_60_jobs.csv", "tiresias", 8),
    ("Alibaba OpenB, 32 GPUs", "alibaba_openb2023_pods.csv", "alibaba", 32),
]
HEAVY_TAIL_LOADS = (0.9, 1.44)
HEAVY_TAIL_GPUS = 32
URGENT = ("RT", "HP")


def offered_load(trace, gpus: int) -> float:
    """GPU-time asked for within the arrival window (a job longer than it counts the window)
    over the capacity in that window."""
    window = trace.jobs[-1].submit_s - trace.jobs[0].submit_s
    return sum(min(j.duration_s, window) * j.num_gpu for j in trace.jobs) / (gpus * window)


def paired_jct_ratio(mine: RunResult, theirs: RunResult) -> float | None:
    """clockq's mean JCT over LAS's on the jobs both finished. The plain means are over
    different jobs: a policy that lets the long-waiting jobs time out drops the longest JCTs
    from its own mean."""
    theirs_by_key = {r.job.key: r.jct_s for r in theirs.jobs}
    pairs = [(r.jct_s, theirs_by_key[r.job.key]) for r in mine.jobs if r.jct_s is not None]
    pairs = [(a, b) for a, b in pairs if b is not None]
    if not pairs:
        return None
    return sum(a for a, _ in pairs) / sum(b for _, b in pairs)


def goals(s: dict[str, dict], load: float, paired: float | None) -> list[tuple[str, str, bool | None]]:
    """The eight goals but speed (bench/replay_speed.py): (goal, figures, met); met is None for
    a figure shown beside a goal but not judged."""
    c, fifo, prio, las = s["clockq"], s["fifo"], s["priority"], s["las"]
    baselines = (fifo, prio, las)
    out = []
    ratio = c["jct_mean_s"] / las["jct_mean_s"]
    pair = "-" if paired is None else f"{paired:.3f}"
    met = ratio <= 1 and (paired is None or paired <= 1)  # on its own jobs and on the common ones
    out.append(("1 mean JCT <= las", f"x{ratio:.3f} ({_t(c['jct_mean_s'])}); jobs both finished x{pair}", met))
    for tier in URGENT:
        if tier not in c["tiers"]:
            continue
        for key, label in (("wait_mean_s", "mean"), ("wait_p95_s", "p95")):
            mine = c["tiers"][tier][key]
            best = min(prio["tiers"][tier][key], las["tiers"][tier][key])
            out.append((f"2 {tier} {label} wait <= best of priority, las", f"{_t(mine)} vs {_t(best)}", mine <= best))
    if load <= 1:
        out.append(("3 on-time >= 91 %", f"{c['on_time_rate']:.1%}", c["on_time_rate"] >= 0.91))
        out.append(("3 timeouts <= 3 %", f"{c['timeout_rate']:.1%}", c["timeout_rate"] <= 0.03))
    else:
        best = max(b["on_time_rate"] for b in baselines)
        out.append(("3 on-time >= best baseline", f"{c['on_time_rate']:.1%} vs {best:.1%}", c["on_time_rate"] >= best))
    share = c["wait_mean_s"] / fifo["wait_mean_s"] if fifo["wait_mean_s"] else 0.0
    out.append(("4 mean wait <= 31 % of fifo", f"{share:.1%} ({_t(c['wait_mean_s'])})", share <= 0.31))
    for tier, figures in c["tiers"].items():
        mine, theirs = figures["wait_p95_s"], fifo["tiers"][tier]["wait_p95_s"]
        if mine is not None and theirs is not None:
            out.append((f"5 {tier} p95 wait <= fifo", f"{_t(mine)} vs {_t(theirs)}", mine <= theirs))
    out.append(("6 switch overhead <= 2 %", f"{c['switch_overhead']:.2%}", c["switch_overhead"] <= 0.02))
    # 7: utilisation. What a scheduler decides is whether GPUs sit idle while work waits; that
    # is judged. The utilisations are shown beside it, not judged: over the makespan it measures
    # the drain after the last arrival, and within the arrival window below full load it
    # measures how many jobs a policy keeps in the system, not waste (docs/replay.md).
    idle, least = c["idle_while_waiting"] or 0.0, min(b["idle_while_waiting"] or 0.0 for b in baselines)
    out.append(("7 GPU time idle while jobs wait <= every baseline", f"{idle:.2%} vs {least:.2%}", idle <= least))
    for key, label in (("window_utilisation", "in the arrival window"), ("gpu_utilisation", "over the makespan")):
        best = max(b[key] or 0.0 for b in baselines)
        out.append((f"7 utilisation {label} (shown, not judged)", f"{c[key] or 0.0:.1%} vs best {best:.1%}", None))
    return out


def _t(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds * 1000:.0f} ms"


def compare_admission(name: str, trace, config: Config, plain: dict, render) -> list[str]:
    """Replay clockq with admission control on, once per thing a closed admission may hold
    (the default, then every tier but RT), print each beside clockq without, and return the
    rows of the closing table: held jobs, closures, and with against without."""
    rows = []
    for hold in control.HOLD_MODES:
        run = replay(trace, "clockq", replace(config, admission=control.Thresholds(hold=hold)))
        run.policy = f"clockq + admission ({hold})"
        with_it = report.summarize(run)
        held = f"{run.held_jobs} jobs held, closed {run.admission_closures} times"
        print(f"\n### {name}: admission control holding {hold} ({held})\n")
        print(render([plain, with_it]))
        jct = f"{_t(with_it['jct_mean_s'])} vs {_t(plain['jct_mean_s'])}"
        on_time = f"{with_it['on_time_rate']:.1%} vs {plain['on_time_rate']:.1%}"
        wait = f"{_t(with_it['wait_mean_s'])} vs {_t(plain['wait_mean_s'])}"
        counts = f"{run.held_jobs:,} | {run.admission_closures:,}"
        rows.append(f"| {name} | {hold} | {counts} | {jct} | {on_time} | {wait} |")
    return rows


def cases(seed: int, folder: Path):
    for name, file, fmt, gpus in SHARED_CASES:
        yield name, traces.load(str(DATA / file), fmt), gpus
    for load in HEAVY_TAIL_LOADS:
        path = folder / f"heavy_tail_{load:g}.csv"
        heavy_tail_trace.write(str(path), gpus=HEAVY_TAIL_GPUS, load=load, seed=seed)
        yield f"heavy tail (generated, seed {seed}), load {load:g}", traces.load(str(path), "csv"), HEAVY_TAIL_GPUS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", action="store_true", help="tables as Markdown (for docs/benchmarks.md)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the generated heavy-tailed traces")
    parser.add_argument("--quick", action="store_true", help="skip the doubled switch cost tables")
    args = parser.parse_args()
    render = report.markdown if args.markdown else report.table
    verdicts: dict[str, dict[str, bool]] = {}
    admission_rows: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        for name, trace, gpus in cases(args.seed, Path(folder)):
            config = Config(gpus=gpus)
            load = offered_load(trace, gpus)
            print(f"\n## {name}: {len(trace.jobs)} jobs on {gpus} GPUs, offered load {load:.2f}\n")
            runs = {p: replay(trace, p, config) for p in POLICIES}
            summaries = {p: report.summarize(r) for p, r in runs.items()}
            print(render(list(summaries.values())))
            print(f"\n### Goals on {name}\n")
            verdicts[name] = {}
            for goal, figure, met in goals(summaries, load, paired_jct_ratio(runs["clockq"], runs["las"])):
                if met is None:
                    print(f"- {goal}: {figure}")
                    continue
                print(f"- {goal}: {figure} -> {'met' if met else 'MISSED'}")
                number = goal.split()[0]
                verdicts[name][number] = verdicts[name].get(number, True) and met
            admission_rows += compare_admission(name, trace, config, summaries["clockq"], render)
            if not args.quick:
                doubled = replace(config, switch_cost=SwitchCost(factor=2.0))
                print(f"\n### {name}, every switch costing twice as much\n")
                print(render([report.summarize(replay(trace, p, doubled)) for p in POLICIES]))
    print("\n## Goals on every trace (1-7; 8, speed, is bench/replay_speed.py)\n")
    numbers = sorted({n for v in verdicts.values() for n in v})
    print("| trace | " + " | ".join(numbers) + " |")
    print("|---|" + "---|" * len(numbers))
    for name, v in verdicts.items():
        print(f"| {name} | " + " | ".join("met" if v.get(n, True) else "**missed**" for n in numbers) + " |")
    print("\n## Admission control: clockq with it against clockq without it\n")
    print("| trace | holds | jobs held | closures | mean JCT | on-time | mean wait |")
    print("|---|---|---:|---:|---|---|---|")
    print("\n".join(admission_rows))


if __name__ == "__main__":
    main()
