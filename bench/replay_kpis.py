"""Replay both shared job traces under fifo, priority, las and clockq, and judge the replay's goals.

Usage (from the repository root; bench/replay_kpis.sh runs it with the README's settings):

    .venv/bin/python bench/replay_kpis.py [--markdown]

For each trace: the four policies side by side; the same with every switch costing twice as
much; and, on the Tiresias trace, clockq at three quanta (the convergence table). Then the goals,
each judged against the baselines measured in the same run. The settings (GPUs, time scale,
quantum) are stated with each table; they are chosen to load the cluster, not to favour a policy.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clockq.replay import report, traces
from clockq.replay.engine import Config, SwitchCost
from clockq.replay.policies import POLICIES, replay

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "jobs"
CASES = [
    # name, file, format, GPUs, arrival scale, quantum (s)
    ("Tiresias 60 jobs", "tiresias_60_jobs.csv", "tiresias", 16, 1.0, 7.5),
    ("Tiresias 60 jobs, overloaded", "tiresias_60_jobs.csv", "tiresias", 8, 1.0, 7.5),
    ("Alibaba OpenB 2023", "alibaba_openb2023_pods.csv", "alibaba", 32, 1.0, 60.0),
]
QUANTA = (120.0, 30.0, 7.5)


def offered_load(trace, gpus: int) -> float:
    """GPU-time asked for within the arrival window (a job longer than it counts the window)
    over the capacity in that window."""
    window = trace.jobs[-1].submit_s - trace.jobs[0].submit_s
    return sum(min(j.duration_s, window) * j.num_gpu for j in trace.jobs) / (gpus * window)


def goals(s: dict[str, dict]) -> list[tuple[str, str, bool]]:
    c, fifo, prio, las = s["clockq"], s["fifo"], s["priority"], s["las"]
    out = []
    cut = 1 - c["wait_mean_s"] / fifo["wait_mean_s"] if fifo["wait_mean_s"] else 0.0
    out.append(
        (
            "mean wait >= 69 % lower than fifo",
            f"{cut:+.0%} ({_t(c['wait_mean_s'])} vs {_t(fifo['wait_mean_s'])})",
            cut >= 0.69,
        )
    )
    out.append(("on-time >= 91 %", f"{c['on_time_rate']:.1%}", c["on_time_rate"] >= 0.91))
    out.append(("timeouts <= 3 %", f"{c['timeout_rate']:.1%}", c["timeout_rate"] <= 0.03))
    out.append(("GPU utilisation >= 89 %", f"{c['gpu_utilisation']:.1%}", c["gpu_utilisation"] >= 0.89))
    held = c["held_while_waiting"]
    out.append(
        ("GPUs held while jobs wait >= 89 %", "-" if held is None else f"{held:.1%}", bool(held and held >= 0.89))
    )
    for tier, key in (("RT", "wait_mean_s"), ("HP", "wait_mean_s")):
        if tier in c["tiers"]:
            mine, theirs = c["tiers"][tier][key], prio["tiers"][tier][key]
            out.append((f"{tier} mean wait no worse than priority", f"{_t(mine)} vs {_t(theirs)}", mine <= theirs))
    for tier in ("SP", "BP"):
        if tier in c["tiers"]:
            mine, theirs = c["tiers"][tier]["wait_p95_s"], prio["tiers"][tier]["wait_p95_s"]
            out.append((f"{tier} p95 wait lower than priority", f"{_t(mine)} vs {_t(theirs)}", mine < theirs))
    out.append(
        (
            "mean JCT no worse than las",
            f"{_t(c['jct_mean_s'])} vs {_t(las['jct_mean_s'])}",
            c["jct_mean_s"] <= las["jct_mean_s"],
        )
    )
    return out


def _t(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds * 1000:.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", action="store_true", help="tables as Markdown (for the README)")
    args = parser.parse_args()
    render = report.markdown if args.markdown else report.table
    for name, file, fmt, gpus, scale, quantum in CASES:
        trace = traces.load(str(DATA / file), fmt, arrival_scale=scale)
        config = Config(gpus=gpus, quantum_s=quantum)
        print(
            f"\n## {name}: {len(trace.jobs)} jobs on {gpus} GPUs, arrivals x{scale:g}, "
            f"offered load {offered_load(trace, gpus):.2f}, quantum {quantum:g} s\n"
        )
        summaries = {p: report.summarize(replay(trace, p, config)) for p in POLICIES}
        print(render(list(summaries.values())))
        print(f"\n### Goals on {name}\n")
        for goal, figure, met in goals(summaries):
            print(f"- {goal}: {figure} -> {'met' if met else 'MISSED'}")

        doubled = replace(config, switch_cost=SwitchCost(factor=2.0))
        print(f"\n### {name}, every switch costing twice as much\n")
        print(render([report.summarize(replay(trace, p, doubled)) for p in POLICIES]))

        if fmt == "tiresias" and gpus == 16:
            print(f"\n### {name}: clockq at three quanta\n")
            print(
                render(
                    [
                        {
                            **report.summarize(replay(trace, "clockq", replace(config, quantum_s=q))),
                            "policy": f"clockq q={q:g}s",
                        }
                        for q in QUANTA
                    ]
                )
            )


if __name__ == "__main__":
    main()
