"""Replay a job trace on a running clockq and compare it with the simulator (bench/live_replay).

Usage (from the repository root; the API token in the environment, never on the command line):

    CLOCKQ_API_TOKEN=... .venv/bin/python bench/replay_live.py TRACE --format F --gpus N \
        --url http://127.0.0.1:8000 [--compress 25] [--ladder 300,1200,4800,19200,76800,307200] \
        [--kpi-wait 90s] [--json]

The trace's jobs go to the clockq at URL as `synthetic` jobs through the public API, as a user's
script would send them; the simulator (`python manage.py replay`, clockq/replay) replays the same
converted jobs on the same number of GPUs. `python manage.py createtoken USER` makes a token.

`--compress N` divides the service ladder by N as it divides run times, on both sides: the live
GPU workers must run with CLOCKQ_SERVICE_LADDER_S set to the compressed ladder (the script says
which, and refuses a cluster whose workers announce another). The simulator runs without
admission control, so the cluster should run with admission that cannot close (the script warns
when a job was held). For --compress 25:

    CLOCKQ_GPUS=sim:2 CLOCKQ_SERVICE_LADDER_S=12,96,768,6144 CLOCKQ_ADMISSION_CLOSE_ABOVE=100 \
        .venv/bin/python manage.py runstack
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.live_replay import DEFAULT_STATE_KB_CAP, DEFAULT_STEP_MS, LiveError, render, run_live, token_from_env
from clockq.policy.ordering import DEFAULT_LADDER, Ladder
from clockq.replay import traces
from clockq.replay.config import Config, SwitchCost, ladder_from_text
from clockq.replay.model import TraceError


def number(text: str) -> float:
    """A finite number of at least 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of at least 0")
    return value


def positive(text: str) -> float:
    value = number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def seconds(text: str) -> float:
    """60, 60s, 15m, 2h or 1d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    unit = units.get(text[-1:].lower()) if text else None
    return positive(text[:-1] if unit else text) * (unit or 1)


def ladder(text: str) -> Ladder:
    try:
        return ladder_from_text(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="path to the trace file")
    p.add_argument("--format", required=True, choices=traces.FORMATS, dest="fmt")
    p.add_argument("--gpus", type=int, required=True, help="GPU workers in the live cluster, and the simulator's")
    p.add_argument("--url", required=True, help="the running clockq, e.g. http://127.0.0.1:8000")
    p.add_argument("--time-scale", type=positive, default=1.0, help="divide the trace's arrival times by this")
    p.add_argument("--until", type=seconds, default=None, help="only jobs submitted before this trace time")
    p.add_argument("--checkpoint-mb", type=number, default=100.0, help="state size where the trace gives none")
    p.add_argument("--switch-cost-ms", type=number, default=9.5, help="simulator: fixed part of a switch, ms")
    p.add_argument("--switch-cost-ms-per-mb", type=number, default=1.2, help="simulator: per MB of state, ms")
    p.add_argument("--switch-cost-factor", type=positive, default=1.0, help="simulator: multiply every switch cost")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--compress", type=positive, default=1.0, help="divide arrivals, run times and the service ladder by this"
    )
    p.add_argument(
        "--ladder",
        type=ladder,
        default=DEFAULT_LADDER,
        help="clockq's service ladder in trace GPU-seconds (default: clockq's, "
        f"{','.join(f'{r:g}' for r in DEFAULT_LADDER.base_gpu_s)}), before --compress",
    )
    p.add_argument("--step-ms", type=positive, default=DEFAULT_STEP_MS, help="a synthetic step, ms (default 20)")
    p.add_argument("--state-kb", type=int, default=DEFAULT_STATE_KB_CAP, help="cap on a job's state, KB (1024)")
    p.add_argument("--timeout", type=seconds, default=None, help="give up after (default 60s + 2 x the simulator's)")
    p.add_argument("--kpi-wait", type=seconds, default=0.0, help="wait for the KPI rollup (90s covers it)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        config = Config(
            gpus=args.gpus,
            switch_cost=SwitchCost(
                fixed_ms=args.switch_cost_ms, per_mb_ms=args.switch_cost_ms_per_mb, factor=args.switch_cost_factor
            ),
            seed=args.seed,
            ladder=args.ladder,
        )
        # Every job runs on one GPU live, so a trace's gang jobs fit however many GPUs there are.
        trace = traces.load(
            args.trace, args.fmt, arrival_scale=args.time_scale, until_s=args.until, checkpoint_mb=args.checkpoint_mb
        )
        result = run_live(
            trace,
            url=args.url,
            token=token_from_env(),
            config=config,
            compress=args.compress,
            step_ms=args.step_ms,
            state_kb_cap=args.state_kb,
            timeout_s=args.timeout,
            kpi_wait_s=args.kpi_wait,
            progress=None if args.quiet else lambda line: print(line, file=sys.stderr, flush=True),
        )
    except (TraceError, LiveError, ValueError) as exc:
        sys.exit(f"replay_live: {exc}")
    sys.stdout.write(json.dumps(result, indent=2) + "\n" if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
