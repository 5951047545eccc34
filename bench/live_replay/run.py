"""The whole live run: convert, simulate, submit, wait, read back, compare."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.live_replay.api import Client, LiveError, check_cluster
from bench.live_replay.compare import compare
from bench.live_replay.plan import DEFAULT_STATE_KB_CAP, DEFAULT_STEP_MS, convert, simulate
from bench.live_replay.readback import TERMINAL, Progress, Submitted, fetch_kpis, live_job, submit_all, wait_for_all
from clockq.replay.config import Config
from clockq.replay.model import Trace


def run_live(
    trace: Trace,
    *,
    url: str,
    token: str,
    config: Config,
    compress: float = 1.0,
    step_ms: float = DEFAULT_STEP_MS,
    state_kb_cap: int = DEFAULT_STATE_KB_CAP,
    timeout_s: float | None = None,
    poll_s: float = 0.5,
    kpi_wait_s: float = 0.0,
    progress: Progress | None = None,
    client: Client | None = None,
) -> dict[str, Any]:
    """Convert, simulate, submit, wait, read back, compare (see bench/live_replay/__init__.py).

    `config.ladder` is the trace's service ladder: both sides run it divided by `compress`, and
    a cluster whose GPU workers run another is refused before anything is submitted
    (check_cluster). The simulator runs first: its makespan bounds the wait, by default 60 s +
    twice its last finish. If the run is cut short (timeout, an error, Ctrl-C), the jobs it
    submitted that have not ended are cancelled, and the error says so."""
    plan = convert(trace, compress=compress, step_ms=step_ms, state_kb_cap=state_kb_cap, ladder=config.ladder)
    sim = simulate(plan, config)
    sim_end = max((r.finish_s or 0.0 for r in sim.jobs), default=0.0)
    if timeout_s is None:
        timeout_s = 60.0 + 2.0 * sim_end
    client = client or Client(url, token)
    warnings = check_cluster(client, config.gpus, plan.ladder)
    if progress:
        progress(
            f"live: {len(plan.bodies)} jobs to {client.url} on {config.gpus} GPU(s); the simulator expects "
            f"the last to end at {sim_end:.1f} s (giving up after {timeout_s:.0f} s)"
        )
    submitted: list[Submitted] = []
    t0 = time.monotonic()
    try:
        submit_all(client, plan, progress=progress, submitted=submitted)
        answers = wait_for_all(client, submitted, timeout_s=timeout_s, since=t0, poll_s=poll_s, progress=progress)
    except BaseException as exc:
        cancelled = _cancel_unfinished(client, submitted)
        if isinstance(exc, LiveError) and cancelled:
            raise LiveError(f"{exc}; cancelled the {len(cancelled)} unfinished job(s) it had submitted") from exc
        raise
    live = [live_job(s, answers[s.id]) for s in submitted]
    ends = [j.finished_at for j in live if j.finished_at]
    since = min(j.submitted_at for j in live)
    until = max(ends) if ends else datetime.now(UTC)
    if progress and kpi_wait_s > 0:
        progress(f"waiting up to {kpi_wait_s:.0f} s for the KPI rollup to cover the run")
    kpis = fetch_kpis(client, since, until + timedelta(seconds=1), wait_s=kpi_wait_s)
    return compare(plan, sim, live, gpus=config.gpus, kpis=kpis, warnings=warnings)


def _cancel_unfinished(client: Client, submitted: Sequence[Submitted]) -> list[int]:
    cancelled = []
    for s in submitted:
        try:
            if client.job(s.id)["state"] not in TERMINAL:
                client.cancel(s.id)
                cancelled.append(s.id)
        except (LiveError, KeyError):
            continue  # best effort: it may have ended meanwhile (409), or the server is gone
    return cancelled
