"""python manage.py replay TRACE: replay a job trace under fifo, priority, las and clockq's policy,
side by side (clockq/replay). Needs no database, broker or worker: the simulator is pure Python.
Replaying a trace on a running clockq, against the simulator, is a client's job: bench/replay_live.py."""

from __future__ import annotations

import argparse
import json
import math
import sys

from django.core.management.base import BaseCommand, CommandError

from clockq.policy import control
from clockq.policy.ordering import DEFAULT_LADDER
from clockq.replay import report, traces
from clockq.replay.config import Config, SwitchCost, ladder_from_text, ladder_text
from clockq.replay.model import TraceError
from clockq.replay.policies import POLICIES, replay

LIVE_FLAGS = ("--live", "--compress", "--live-step-ms", "--live-state-kb", "--live-timeout", "--live-kpi-wait")


def _number(text: str, *, minimum: float = 0.0) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value >= minimum):
        raise ValueError(f"{text!r} must be a finite number of at least {minimum:g}")
    return value


def _positive(text: str) -> float:
    value = _number(text, minimum=-math.inf)
    if not value > 0:
        raise ValueError(f"{text!r} must be a positive number")
    return value


def _option(name: str, parse, text: str):
    """Parse one option's value; a bad one says which option it was."""
    try:
        return parse(text)
    except ValueError as exc:
        raise ValueError(f"--{name}: {exc}") from None


def _seconds(text: str) -> float:
    """60, 60s, 15m, 2h or 1d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    unit = units.get(text[-1:].lower()) if text else None
    return _positive(text[:-1] if unit else text) * (unit or 1)


class Command(BaseCommand):
    help = "Replay a job trace under several scheduling policies and print their results side by side."

    def add_arguments(self, parser):
        parser.add_argument("trace", help="path to the trace file")
        parser.add_argument("--format", required=True, choices=traces.FORMATS, dest="fmt")
        parser.add_argument("--policy", default=",".join(POLICIES), help="comma-separated: fifo,priority,las,clockq")
        parser.add_argument("--gpus", type=int, required=True, help="GPUs in the simulated cluster")
        parser.add_argument(
            "--time-scale",
            default="1",
            help="divide arrival times by this (more load); run times are kept (default 1)",
        )
        parser.add_argument("--until", default=None, help="replay only jobs submitted before this trace time")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--slack", default="2", help="derived deadline: wait target + run time x slack")
        parser.add_argument("--checkpoint-mb", default="100", help="state size where the trace gives none")
        parser.add_argument("--switch-cost-ms", default="9.5", help="fixed part of a switch, ms")
        parser.add_argument("--switch-cost-ms-per-mb", default="1.2", help="per MB of state, ms")
        parser.add_argument("--switch-cost-factor", default="1", help="multiply every switch cost (2: twice)")
        parser.add_argument(
            "--ladder",
            default=None,
            help="clockq's service ladder: the least urgent tier's rungs in GPU-seconds, as CLOCKQ_SERVICE_LADDER_S "
            f"(default {','.join(f'{r:g}' for r in DEFAULT_LADDER.base_gpu_s)}); more urgent tiers stretch it",
        )
        parser.add_argument(
            "--admission",
            nargs="?",
            const=control.HOLD_WHEN_FULL,
            default=None,
            choices=control.HOLD_MODES,
            help="replay with admission control: the live rules (close above 85%%, reopen below 75%%) on a "
            "persistence forecast of the load index, every 60 s; what a closed admission holds, as "
            "CLOCKQ_ADMISSION_HOLDS (default when-full: only jobs that would wait anyway)",
        )
        parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
        parser.add_argument("--plot", default=None, help="wait CDFs per policy and tier: out.html or out.png")
        parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
        # Live replays drive a running clockq through its API, as a client: bench/replay_live.py.
        for flag in LIVE_FLAGS:
            parser.add_argument(flag, default=None, help=argparse.SUPPRESS)

    def handle(self, *args, **o):
        live = [flag for flag in LIVE_FLAGS if o[flag.lstrip("-").replace("-", "_")] is not None]
        if live:
            raise CommandError(
                f"{', '.join(live)}: live replays moved to bench/replay_live.py (same trace options, --url URL, "
                "--compress, --step-ms, --state-kb, --timeout, --kpi-wait); this command runs the simulator only"
            )
        try:
            policies = [p.strip() for p in o["policy"].split(",") if p.strip()]
            unknown = [p for p in policies if p not in POLICIES]
            if unknown or not policies:
                raise ValueError(
                    f"--policy: unknown {', '.join(unknown) or 'empty list'}; choose from {', '.join(POLICIES)}"
                )
            if o["gpus"] < 1:
                raise ValueError("--gpus must be at least 1")
            if o["plot"] and not o["plot"].lower().endswith((".html", ".png")):
                raise ValueError("--plot must name an .html or .png file")
            config = Config(
                gpus=o["gpus"],
                switch_cost=SwitchCost(
                    fixed_ms=_option("switch-cost-ms", _number, o["switch_cost_ms"]),
                    per_mb_ms=_option("switch-cost-ms-per-mb", _number, o["switch_cost_ms_per_mb"]),
                    factor=_option("switch-cost-factor", _positive, o["switch_cost_factor"]),
                ),
                seed=o["seed"],
                ladder=_option("ladder", ladder_from_text, o["ladder"]) if o["ladder"] else DEFAULT_LADDER,
                admission=control.Thresholds(hold=o["admission"]) if o["admission"] else None,
                progress=None if o["quiet"] else self._progress,
            )
            trace = traces.load(
                o["trace"],
                o["fmt"],
                arrival_scale=_option("time-scale", _positive, o["time_scale"]),
                until_s=_option("until", _seconds, o["until"]) if o["until"] else None,
                slack=_option("slack", _number, o["slack"]),
                checkpoint_mb=_option("checkpoint-mb", _number, o["checkpoint_mb"]),
            )
            traces.check_fits(trace, o["gpus"], o["trace"])
        except (TraceError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        runs = [replay(trace, policy, config) for policy in policies]
        summaries = [report.summarize(run) for run in runs]
        if o["json"]:
            out = {"trace": _describe(trace, o, config), "policies": summaries}
            self.stdout.write(json.dumps(out, indent=2))
        else:
            self.stdout.write(_header(trace, o, config))
            self.stdout.write(report.table(summaries))
        if o["plot"]:
            report.plot(runs, o["plot"])
            self.stderr.write(f"wrote {o['plot']}")

    def _progress(self, p: dict) -> None:
        sys.stderr.write(
            f"\r{p['policy']}: {p['jobs_done']}/{p['jobs']} jobs done, simulated {p['sim_time_s'] / 3600:.1f} h, "
            f"{p['events_per_s']:,.0f} events/s   "
        )
        if p["jobs_done"] == p["jobs"]:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _describe(trace, o, config: Config) -> dict:
    return {
        "name": trace.name,
        "format": o["fmt"],
        "jobs": len(trace.jobs),
        "skipped": trace.skipped,
        "mapping": trace.mapping,
        "gpus": o["gpus"],
        "time_scale": o["time_scale"],
        "slack": o["slack"],
        "switch_cost_factor": o["switch_cost_factor"],
        "ladder_gpu_s": ladder_text(config.ladder),
        "seed": o["seed"],
    }


def _header(trace, o, config: Config) -> str:
    lines = [
        f"{trace.name}: {len(trace.jobs)} jobs on {o['gpus']} GPUs, arrivals x{o['time_scale']}, "
        f"slack {o['slack']}, switch cost x{o['switch_cost_factor']}, seed {o['seed']}",
        f"  clockq's service ladder: {ladder_text(config.ladder)} GPU-seconds (the least urgent tier's rungs)",
    ]
    lines += [f"  skipped {n}: {reason}" for reason, n in trace.skipped.items()]
    lines += [f"  {line}" for line in trace.mapping]
    return "\n".join(lines) + "\n"
