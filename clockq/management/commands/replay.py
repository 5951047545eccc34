"""python manage.py replay TRACE: replay a job trace under fifo, priority, las and clockq's policy,
side by side (clockq/replay). Needs no database, broker or worker: the simulator is pure Python."""

from __future__ import annotations

import json
import math
import sys

from django.core.management.base import BaseCommand, CommandError

from clockq.replay import report, traces
from clockq.replay.engine import Config, SwitchCost
from clockq.replay.model import TraceError
from clockq.replay.policies import POLICIES, replay


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
        parser.add_argument("--quantum", default="60s", help="simulated length of a contended slice (default 60s)")
        parser.add_argument("--until", default=None, help="replay only jobs submitted before this trace time")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--slack", default="2", help="derived deadline: wait target + run time x slack")
        parser.add_argument("--checkpoint-mb", default="100", help="state size where the trace gives none")
        parser.add_argument("--switch-cost-ms", default="9.5", help="fixed part of a switch, ms")
        parser.add_argument("--switch-cost-ms-per-mb", default="1.2", help="per MB of state, ms")
        parser.add_argument("--switch-cost-factor", default="1", help="multiply every switch cost (2: twice)")
        parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
        parser.add_argument("--plot", default=None, help="wait CDFs per policy and tier: out.html or out.png")
        parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
        parser.add_argument(
            "--live",
            default=None,
            metavar="URL",
            help="submit the trace to the clockq at URL as synthetic jobs (API token in CLOCKQ_API_TOKEN) and "
            "compare with the simulator's replay of the same jobs (clockq/replay/live.py)",
        )
        parser.add_argument("--compress", default="1", help="live mode: divide arrivals and run times by this")
        parser.add_argument("--live-step-ms", default="20", help="live mode: a synthetic step, ms (default 20)")
        parser.add_argument("--live-state-kb", type=int, default=1024, help="live mode: cap on a job's state, KB")
        parser.add_argument("--live-timeout", default=None, help="live mode: give up after (default 60s + 2 x sim)")
        parser.add_argument("--live-kpi-wait", default=None, help="live mode: wait for the KPI rollup (90s covers it)")

    def handle(self, *args, **o):
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
                quantum_s=_option("quantum", _seconds, o["quantum"]),
                switch_cost=SwitchCost(
                    fixed_ms=_option("switch-cost-ms", _number, o["switch_cost_ms"]),
                    per_mb_ms=_option("switch-cost-ms-per-mb", _number, o["switch_cost_ms_per_mb"]),
                    factor=_option("switch-cost-factor", _positive, o["switch_cost_factor"]),
                ),
                seed=o["seed"],
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
            if not o["live"]:  # live mode runs every job on one GPU
                traces.check_fits(trace, o["gpus"], o["trace"])
        except (TraceError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        if o["live"]:
            self._live(trace, config, o)
            return
        runs = [replay(trace, policy, config) for policy in policies]
        summaries = [report.summarize(run) for run in runs]
        if o["json"]:
            out = {"trace": _describe(trace, o), "policies": summaries}
            self.stdout.write(json.dumps(out, indent=2))
        else:
            self.stdout.write(_header(trace, o))
            self.stdout.write(report.table(summaries))
        if o["plot"]:
            report.plot(runs, o["plot"])
            self.stderr.write(f"wrote {o['plot']}")

    def _live(self, trace, config, o) -> None:
        from clockq.replay import live

        try:
            result = live.run_live(
                trace,
                url=o["live"],
                token=live.token_from_env(),
                config=config,
                compress=_option("compress", _positive, o["compress"]),
                step_ms=_option("live-step-ms", _positive, o["live_step_ms"]),
                state_kb_cap=o["live_state_kb"],
                timeout_s=_option("live-timeout", _seconds, o["live_timeout"]) if o["live_timeout"] else None,
                kpi_wait_s=_option("live-kpi-wait", _seconds, o["live_kpi_wait"]) if o["live_kpi_wait"] else 0.0,
                progress=None if o["quiet"] else self.stderr.write,
            )
        except (live.LiveError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps(result, indent=2) if o["json"] else live.render(result))

    def _progress(self, p: dict) -> None:
        sys.stderr.write(
            f"\r{p['policy']}: {p['jobs_done']}/{p['jobs']} jobs done, simulated {p['sim_time_s'] / 3600:.1f} h, "
            f"{p['events_per_s']:,.0f} events/s   "
        )
        if p["jobs_done"] == p["jobs"]:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _describe(trace, o) -> dict:
    return {
        "name": trace.name,
        "format": o["fmt"],
        "jobs": len(trace.jobs),
        "skipped": trace.skipped,
        "mapping": trace.mapping,
        "gpus": o["gpus"],
        "time_scale": o["time_scale"],
        "quantum": o["quantum"],
        "slack": o["slack"],
        "switch_cost_factor": o["switch_cost_factor"],
        "seed": o["seed"],
    }


def _header(trace, o) -> str:
    lines = [
        f"{trace.name}: {len(trace.jobs)} jobs on {o['gpus']} GPUs, arrivals x{o['time_scale']}, "
        f"quantum {o['quantum']}, slack {o['slack']}, switch cost x{o['switch_cost_factor']}, seed {o['seed']}"
    ]
    lines += [f"  skipped {n}: {reason}" for reason, n in trace.skipped.items()]
    lines += [f"  {line}" for line in trace.mapping]
    return "\n".join(lines) + "\n"
