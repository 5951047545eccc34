"""What the live system runs: the trace converted to single-GPU synthetic jobs in live seconds,
one POST body per job, and the simulator's replay of the same converted jobs."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace
from typing import Any

from clockq.policy import ordering
from clockq.policy.tiers import TIERS
from clockq.replay.config import Config, ladder_text
from clockq.replay.model import RunResult, Trace
from clockq.replay.policies import replay

DEFAULT_STEP_MS = 20.0
DEFAULT_STATE_KB_CAP = 1024
DEFAULT_GPU_UTIL = 0.9  # the synthetic workload's own default
MAX_STEPS = 10_000_000  # the synthetic workload's limits (clockq/jobs/workload_params.py)
MAX_STEP_MS = 60_000.0
MAX_STATE_KB = 1_048_576
NAME_MAX = 200  # Job.name


@dataclass(frozen=True)
class LivePlan:
    """The converted trace (what both sides run, in live seconds) and one POST body per job."""

    trace: Trace
    bodies: list[dict[str, Any]]
    compress: float
    step_ms: float
    state_kb_cap: int
    multi_gpu_jobs: int  # jobs that asked for more than one GPU in the original trace
    capped_state_jobs: int  # jobs whose state was cut to state_kb_cap
    ladder: ordering.Ladder = ordering.DEFAULT_LADDER  # in live seconds: the trace's, compressed

    def past_first_rung(self) -> int:
        """Jobs whose run time passes the first rung of their tier's ladder: those whose level
        changes while they run, so that the order by attained service is put to the test."""
        rank = {t.code: t.rank for t in TIERS}
        return sum(1 for j in self.trace.jobs if j.duration_s >= self.ladder.rungs(rank[j.tier])[0])


def compress_ladder(ladder: ordering.Ladder, compress: float) -> ordering.Ladder:
    """The ladder in live seconds: its rungs divided by `compress`, as run times are, so that a
    job crosses the same rungs live as in the trace."""
    return dataclasses.replace(ladder, base_gpu_s=tuple(rung / compress for rung in ladder.base_gpu_s))


def convert(
    trace: Trace,
    *,
    compress: float = 1.0,
    step_ms: float = DEFAULT_STEP_MS,
    state_kb_cap: int = DEFAULT_STATE_KB_CAP,
    ladder: ordering.Ladder = ordering.DEFAULT_LADDER,
    name_prefix: str = "replay",
) -> LivePlan:
    """Turn `trace` into what the live system can run, and the same jobs for the simulator.

    Each job gets num_gpu = 1: **multi-GPU jobs run as single-GPU jobs with the same duration**
    (the live system runs single-GPU jobs only), and the simulator comparison runs on this same
    converted trace, so both sides see the same jobs. Times are divided by `compress` and shifted
    so the first job arrives at 0; a duration becomes max(1, round(duration * 1000 / step_ms))
    steps of `step_ms`, and the simulator gets exactly steps * step_ms. The state is the job's
    checkpoint_mb in KB, capped at `state_kb_cap` (a compressed replay cannot afford GB
    checkpoints); the simulator prices switches for the capped size. Deadlines are dropped on
    both sides. gpu_util is the job's avg_util, else 0.9, on both sides. The service ladder
    (`ladder`, in trace GPU-seconds) is divided by `compress` too. Every job is the one user's
    whose token submits them live, in the simulator too: the trace's users are dropped.
    """
    _check_options(trace, compress=compress, step_ms=step_ms, state_kb_cap=state_kb_cap)
    origin = trace.jobs[0].submit_s
    live_ladder = compress_ladder(ladder, compress)
    jobs, bodies = [], []
    multi = capped = 0
    for job in trace.jobs:
        live_s = job.duration_s / compress
        steps = max(1, round(live_s * 1000.0 / step_ms))
        if steps > MAX_STEPS:
            raise ValueError(
                f"job {job.key!r} (line {job.line}) would need {steps:,} steps of {step_ms:g} ms, more than "
                f"the synthetic workload's {MAX_STEPS:,}: compress more, or use longer steps"
            )
        wanted_kb = round(job.checkpoint_mb * 1024)
        state_kb = min(wanted_kb, state_kb_cap)
        multi += job.num_gpu > 1
        capped += wanted_kb > state_kb_cap
        gpu_util = DEFAULT_GPU_UTIL if job.avg_util is None else min(max(job.avg_util, 0.0), 1.0)
        jobs.append(
            replace(
                job,
                submit_s=(job.submit_s - origin) / compress,
                duration_s=steps * step_ms / 1000.0,
                num_gpu=1,
                deadline_s=None,
                checkpoint_mb=state_kb / 1024,
                avg_util=gpu_util,
                user="",
            )
        )
        bodies.append(
            {
                "name": f"{name_prefix}:{job.key}"[:NAME_MAX],
                "tier": job.tier,
                "workload": "synthetic",
                "params": {"steps": steps, "step_ms": step_ms, "state_kb": state_kb, "gpu_util": gpu_util},
            }
        )
    mapping = [
        *trace.mapping,
        "live mode: every job runs on one GPU (the live system runs single-GPU jobs only); "
        f"{multi} multi-GPU job(s) ran as single-GPU jobs with the same duration, in the simulator too",
        f"live mode: arrivals and durations / {compress:g}, the first arrival at 0; "
        f"durations in whole steps of {step_ms:g} ms",
        f"live mode: state = checkpoint_mb in KB, capped at {state_kb_cap} KB ({capped} job(s) capped); "
        "switches cost what the capped state costs, on both sides",
        "live mode: no deadlines on either side; tier start timeouts still apply",
        f"live mode: clockq's service ladder / {compress:g}: {ladder_text(live_ladder)} GPU-seconds, on both sides",
        "live mode: every job is one user's (the API token's), in the simulator too",
    ]
    converted = replace(trace, jobs=jobs, mapping=mapping)
    return LivePlan(converted, bodies, compress, step_ms, state_kb_cap, multi, capped, live_ladder)


def _check_options(trace: Trace, *, compress: float, step_ms: float, state_kb_cap: int) -> None:
    if not (math.isfinite(compress) and compress > 0):
        raise ValueError(f"compress must be a finite number > 0, not {compress!r}")
    if not (math.isfinite(step_ms) and 0 < step_ms <= MAX_STEP_MS):
        raise ValueError(f"step_ms must be above 0 and at most {MAX_STEP_MS:g}, not {step_ms!r}")
    if not (isinstance(state_kb_cap, int) and 0 <= state_kb_cap <= MAX_STATE_KB):
        raise ValueError(f"state_kb_cap must be a whole number from 0 to {MAX_STATE_KB}, not {state_kb_cap!r}")
    if not trace.jobs:
        raise ValueError("the trace has no jobs")


def simulate(plan: LivePlan, config: Config) -> RunResult:
    """clockq's policy replayed over the converted trace, on the plan's (compressed) ladder."""
    return replay(plan.trace, "clockq", replace(config, ladder=plan.ladder, progress=None))
